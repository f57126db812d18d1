package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of a ProxyPool the API server applies, exported so code that
// builds pools without it (unit tests) agrees.
const (
	// DefaultPoolReplicas is spec.replicas when unset, so /scale always has a value.
	DefaultPoolReplicas int32 = 1
	// DefaultPoolMaxUnavailable is spec.maxUnavailable when unset.
	DefaultPoolMaxUnavailable int32 = 1
	// DefaultPoolMaxSurge is spec.maxSurge when unset.
	DefaultPoolMaxSurge int32 = 1
	// DefaultPoolDrainSeconds is spec.drainSeconds when unset: long enough for
	// a default 60s lease to run out.
	DefaultPoolDrainSeconds int32 = 60
	// DefaultAutoscalingMinReplicas is spec.autoscaling.minReplicas when unset.
	DefaultAutoscalingMinReplicas int32 = 1
	// DefaultTargetLeasesPerProxy is spec.autoscaling.targetLeasesPerProxy when unset.
	DefaultTargetLeasesPerProxy int32 = 10
	// DefaultReplaceUnhealthyAfter is spec.replaceUnhealthyAfter when unset.
	DefaultReplaceUnhealthyAfter = 5 * time.Minute
	// MaxHealBackoff caps the wait between rounds of replacing unhealthy
	// Proxies when the previous rounds' replacements went unhealthy too
	// (it is never below replaceUnhealthyAfter itself).
	MaxHealBackoff = time.Hour
	// DefaultRecycleWindow is spec.recycle.window when unset: as long as a
	// lease store remembers a ban after it ended, with the default
	// --max-cooldown.
	DefaultRecycleWindow = time.Hour
	// DefaultScaleDownDelaySeconds is spec.autoscaling.scaleDownDelaySeconds
	// when unset: the HPA's default downscale stabilization window.
	DefaultScaleDownDelaySeconds int32 = 300
)

// ProxyPool labels, annotations, finalizer and conditions.
const (
	// LabelPool on a Proxy names the ProxyPool that owns it; the pool's
	// selector (status.selector, what /scale reports) is this label.
	LabelPool = "proxyfleet.io/pool"
	// AttributeNamespace is the member attribute the controller's lease
	// API gives every Proxy: its namespace (with LabelPool, the pool's
	// name, as the attribute of the same key), over whatever
	// spec.attributes say, so that selectors and tenancy can name the
	// owner (docs/tenancy.md).
	AttributeNamespace = "proxyfleet.io/namespace"
	// LabelPoolTemplateHash on a Proxy is the hash of the pool template it
	// was created from; a Proxy whose hash differs from the current
	// template's is replaced (rolled).
	LabelPoolTemplateHash = "proxyfleet.io/pool-template-hash"
	// AnnotationDraining on a Proxy (an RFC 3339 time, when draining began)
	// takes it out of the lease API: no new leases, existing ones run on. A
	// ProxyPool sets it on a Proxy it is about to delete; a human may set it
	// on any Proxy to stop it being leased.
	AnnotationDraining = "proxyfleet.io/draining"
	// AnnotationRecycled on a Proxy a ProxyPool drains to recycle it says
	// why: the sites that had it in ban or rate-limit cooldown within
	// spec.recycle.window. Written with the draining annotation, in one patch.
	AnnotationRecycled = "proxyfleet.io/recycled"
	// PoolFinalizer holds a ProxyPool being deleted until its Proxies (and
	// through their own finalizer, their instances) are gone.
	PoolFinalizer = "proxyfleet.io/pool-cleanup"

	// ConditionAbleToScale (autoscaling only) says whether the autoscaler
	// could act and what it decided last, in the manner of the HPA.
	ConditionAbleToScale = "AbleToScale"
	// ConditionScalingLimited (autoscaling only) is True when the computed
	// size was clamped to minReplicas or maxReplicas.
	ConditionScalingLimited = "ScalingLimited"
	// ConditionHealing (with spec.replaceUnhealthyAfter) is True while the
	// pool has Proxies Unhealthy or Failed that it is replacing, waiting to
	// replace, or backing off from replacing; False when it has none.
	ConditionHealing = "Healing"
	// ConditionRecycling (with spec.recycle) is True while the pool replaces
	// Proxies that too many sites banned, False when none is; its message
	// names the Proxies and the sites.
	ConditionRecycling = "Recycling"
)

// Condition reasons of a ProxyPool.
const (
	// ReasonAllReady: every desired Proxy is Ready and of the current template.
	ReasonAllReady = "AllReady"
	// ReasonScaling: Proxies are being created or drained to reach spec.replicas.
	ReasonScaling = "Scaling"
	// ReasonRollingOut: Proxies of an old template (or past maxAge) are being replaced.
	ReasonRollingOut = "RollingOut"
	// ReasonNotReady: the pool has its Proxies but fewer than desired are Ready.
	ReasonNotReady = "NotReady"
	// ReasonDeletingPool: the pool is being deleted with its Proxies.
	ReasonDeletingPool = "Deleting"
	// ReasonFailedCreate: the API server refused the last Proxy the pool
	// tried to create (a template label it does not accept, a
	// ResourceQuota, an admission webhook); the message quotes it.
	ReasonFailedCreate = "FailedCreate"

	// ReasonSucceededRescale: the autoscaler changed spec.replicas.
	ReasonSucceededRescale = "SucceededRescale"
	// ReasonReadyForNewScale: the autoscaler computed the current size.
	ReasonReadyForNewScale = "ReadyForNewScale"
	// ReasonScaleDownDelayed: a smaller size was computed, and is held until
	// it has been so for scaleDownDelaySeconds.
	ReasonScaleDownDelayed = "ScaleDownDelayed"
	// ReasonFailedUpdateScale: writing /scale failed.
	ReasonFailedUpdateScale = "FailedUpdateScale"
	// ReasonNoLeaseStore: the controller serves no lease API
	// (--lease-api-listen 0), so there is nothing to scale on.
	ReasonNoLeaseStore = "NoLeaseStore"
	// ReasonTooFewReplicas: the computed size was below minReplicas.
	ReasonTooFewReplicas = "TooFewReplicas"
	// ReasonTooManyReplicas: the computed size was above maxReplicas.
	ReasonTooManyReplicas = "TooManyReplicas"
	// ReasonDesiredWithinRange: the computed size needed no clamping.
	ReasonDesiredWithinRange = "DesiredWithinRange"

	// ReasonReplacingUnhealthy: Proxies Unhealthy or Failed for
	// replaceUnhealthyAfter are being replaced.
	ReasonReplacingUnhealthy = "ReplacingUnhealthy"
	// ReasonWaitingToReplace: Proxies are Unhealthy or Failed, not yet for
	// replaceUnhealthyAfter.
	ReasonWaitingToReplace = "WaitingToReplace"
	// ReasonReplacementBackoff: the last rounds' replacements went Unhealthy
	// or Failed too (the provider keeps failing): the next round waits,
	// twice as long each time.
	ReasonReplacementBackoff = "ReplacementBackoff"
	// ReasonNoneUnhealthy: no Proxy of the pool is Unhealthy or Failed.
	ReasonNoneUnhealthy = "NoneUnhealthy"

	// ReasonRecyclingBanned: Proxies in ban or rate-limit cooldown for
	// spec.recycle.bannedSites sites or more are being replaced.
	ReasonRecyclingBanned = "RecyclingBanned"
	// ReasonNoneBanned: no Proxy of the pool is banned by that many sites.
	ReasonNoneBanned = "NoneBanned"
	// ReasonNoBanSource: the controller has no lease store to read bans
	// from (--lease-api-listen 0), so nothing is recycled.
	ReasonNoBanSource = "NoBanSource"
	// ReasonBanSourceUnavailable: the lease store could not be read this
	// pass (a shared store that is down); nothing is recycled until it is.
	ReasonBanSourceUnavailable = "BanSourceUnavailable"
)

// ProxyPoolSpec is the desired set of Proxies.
//
// +kubebuilder:validation:XValidation:rule="!has(self.maxSurge) || !has(self.maxUnavailable) || self.maxSurge > 0 || self.maxUnavailable > 0",message="maxSurge and maxUnavailable must not both be 0: a rollout could neither add a Proxy nor take one out"
type ProxyPoolSpec struct {
	// Replicas is how many Proxies the pool keeps. kubectl scale and an
	// autoscaler write it through the scale subresource; with
	// spec.autoscaling the controller does.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is what every Proxy of the pool is created from. Any change
	// replaces the Proxies, maxSurge and maxUnavailable at a time.
	Template ProxyTemplate `json:"template"`

	// MaxAge replaces a Proxy older than this (a Go duration such as 24h),
	// for a fresh egress IP; unset keeps Proxies as long as they live.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) > duration('0s')",message="maxAge must be a positive Go duration such as 30m or 24h"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// MaxUnavailable is how far below replicas the Ready count may drop while
	// Proxies are replaced (template change, maxAge). With maxSurge 0 it is
	// how many old Proxies are drained before their replacements exist.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxUnavailable *int32 `json:"maxUnavailable,omitempty"`

	// MaxSurge is how many Proxies above replicas may exist while Proxies
	// are replaced: new ones come first, and an old one is drained only once
	// a replacement is Ready.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxSurge *int32 `json:"maxSurge,omitempty"`

	// ReplaceUnhealthyAfter replaces a Proxy that has been Unhealthy or
	// Failed this long (a Go duration such as 5m; "0" never replaces),
	// within maxSurge and maxUnavailable: its replacement is created and it
	// is drained as a scale-down drains. When a round's replacements go
	// Unhealthy or Failed too, the next round waits twice as long (up to an
	// hour) and the Healing condition says why.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self == '0' || (self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s'))",message="replaceUnhealthyAfter must be a Go duration such as 5m, or 0 to never replace"
	// +optional
	ReplaceUnhealthyAfter *metav1.Duration `json:"replaceUnhealthyAfter,omitempty"`

	// DrainSeconds is how long a Proxy picked for removal keeps its leases
	// (it gets no new ones) before it is deleted; it goes earlier when its
	// last lease ends.
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	DrainSeconds *int32 `json:"drainSeconds,omitempty"`

	// Autoscaling lets the controller set replicas from its lease store.
	// Without it, replicas is the user's (or an HPA's).
	// +optional
	Autoscaling *PoolAutoscaling `json:"autoscaling,omitempty"`

	// Recycle replaces a Proxy that too many sites have banned: its
	// address is burnt, and a new instance (on gcp and kvm, a new egress
	// address) is worth more. Unset never recycles.
	// +optional
	Recycle *PoolRecycle `json:"recycle,omitempty"`
}

// PoolRecycle replaces a Proxy that was in ban or rate-limit cooldown for
// at least bannedSites distinct sites within window, as the lease store the
// gateways report to recorded it: its replacement first, within maxSurge
// and maxUnavailable, and drained as a scale-down drains.
type PoolRecycle struct {
	// BannedSites is how many distinct sites must have banned (403) or
	// rate-limited (429) a Proxy within window for it to be recycled.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	BannedSites int32 `json:"bannedSites"`

	// Window is how far back a ban counts (a Go duration such as 1h): a
	// cooldown running now, or one that ended less than window ago. The
	// lease store remembers an ended cooldown for --max-cooldown (1h by
	// default), so a longer window sees no further back than that.
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) > duration('0s')",message="recycle.window must be a positive Go duration such as 30m or 1h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
}

// ProxyTemplate is the Proxy a pool stamps out.
type ProxyTemplate struct {
	// Metadata carries the labels every Proxy of the pool gets (the pool
	// adds proxyfleet.io/pool and proxyfleet.io/pool-template-hash).
	// +optional
	Metadata ProxyTemplateMeta `json:"metadata,omitempty"`

	// Spec is the Proxy spec, validated as a Proxy's is.
	Spec ProxySpec `json:"spec"`
}

// ProxyTemplateMeta is the part of a Proxy's metadata a template sets.
type ProxyTemplateMeta struct {
	// Labels are copied onto every Proxy of the pool.
	// +kubebuilder:validation:XValidation:rule="!('proxyfleet.io/pool' in self) && !('proxyfleet.io/pool-template-hash' in self)",message="template.metadata.labels must not set proxyfleet.io/pool or proxyfleet.io/pool-template-hash: the pool sets them"
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// PoolAutoscaling sizes the pool from the controller's lease store: active
// leases on the pool's Proxies divided by targetLeasesPerProxy, one more when
// lease requests the pool would have matched were refused recently, clamped
// to [minReplicas, maxReplicas].
//
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
type PoolAutoscaling struct {
	// MinReplicas is the smallest size the autoscaler sets.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// MaxReplicas is the largest size the autoscaler sets.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	MaxReplicas int32 `json:"maxReplicas"`

	// TargetLeasesPerProxy is how many active leases one Proxy should carry.
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +optional
	TargetLeasesPerProxy int32 `json:"targetLeasesPerProxy,omitempty"`

	// ScaleDownDelaySeconds is how long the computed size must stay below
	// replicas before the autoscaler scales down.
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	ScaleDownDelaySeconds *int32 `json:"scaleDownDelaySeconds,omitempty"`
}

// ProxyPoolStatus is what the controller observed. The ProxyPool reconciler
// is its only writer.
type ProxyPoolStatus struct {
	// Replicas counts the pool's Proxies in service or coming up: not those
	// draining or being deleted. /scale reports it as the current size.
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas counts the Proxies in service: Healthy and not draining.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// UpdatedReplicas counts the Proxies of the current template and within maxAge.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// DrainingReplicas counts the Proxies picked for removal whose leases
	// may still run.
	// +optional
	DrainingReplicas int32 `json:"drainingReplicas"`

	// DesiredReplicas is the size the pool is driving to (spec.replicas, as
	// the autoscaler set it when spec.autoscaling is on).
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`

	// Selector is the label selector of the pool's Proxies, serialized
	// (proxyfleet.io/pool=<name>), for /scale and an HPA.
	// +optional
	Selector string `json:"selector,omitempty"`

	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// LastScaleTime is when the autoscaler last changed spec.replicas.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`

	// ScaleDownSince is when the autoscaler first computed a size below
	// spec.replicas without computing spec.replicas or more since; it scales
	// down scaleDownDelaySeconds after it.
	// +optional
	ScaleDownSince *metav1.Time `json:"scaleDownSince,omitempty"`

	// FailedReplacementRounds counts the rounds of replacing unhealthy
	// Proxies in a row after which no new Proxy became Ready: each doubles
	// the wait before the next round.
	// +optional
	FailedReplacementRounds int32 `json:"failedReplacementRounds,omitempty"`

	// LastReplacementTime is when the pool last replaced an unhealthy
	// Proxy: the creation time of that round's first replacement (the API
	// server's clock, as the Proxies' creation times the next round judges
	// it by), or the controller's time when no replacement could be created.
	// +optional
	LastReplacementTime *metav1.Time `json:"lastReplacementTime,omitempty"`

	// RecycledReplicas counts the Proxies the pool has recycled because
	// too many sites banned them (spec.recycle), since it was created.
	// +optional
	RecycledReplicas int64 `json:"recycledReplicas,omitempty"`

	// LastRecycleTime is when the pool last started recycling a Proxy.
	// +optional
	LastRecycleTime *metav1.Time `json:"lastRecycleTime,omitempty"`

	// Conditions are Ready and Healing, with spec.recycle Recycling, and
	// with autoscaling AbleToScale and ScalingLimited.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ProxyPool keeps a number of Proxies from one template, as a ReplicaSet does
// Pods: kubectl scale and an HPA size it through the scale subresource, and
// it can size itself from the lease store.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,shortName=pxp
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="a ProxyPool name is at most 63 characters: it is the value of the proxyfleet.io/pool label on its Proxies"
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedReplicas`,priority=1
// +kubebuilder:printcolumn:name="Draining",type=integer,JSONPath=`.status.drainingReplicas`,priority=1
// +kubebuilder:printcolumn:name="Healing",type=string,JSONPath=`.status.conditions[?(@.type=="Healing")].reason`,priority=1
// +kubebuilder:printcolumn:name="Replace-Unhealthy-After",type=string,JSONPath=`.spec.replaceUnhealthyAfter`,priority=1
// +kubebuilder:printcolumn:name="Recycled",type=integer,JSONPath=`.status.recycledReplicas`,priority=1
// +kubebuilder:printcolumn:name="Recycling",type=string,JSONPath=`.status.conditions[?(@.type=="Recycling")].reason`,priority=1
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired pool.
	// +kubebuilder:validation:Required
	Spec ProxyPoolSpec `json:"spec,omitempty"`
	// Status is what the controller observed.
	// +optional
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// ProxyPoolList is a list of ProxyPool objects.
//
// +kubebuilder:object:root=true
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the pools.
	Items []ProxyPool `json:"items"`
}
