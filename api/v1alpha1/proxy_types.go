package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyMode says who owns the upstream proxy behind a Proxy object.
// +kubebuilder:validation:Enum=Managed;External
type ProxyMode string

const (
	// ModeManaged: the controller creates, watches and deletes the instance
	// through the provider named in spec.provider.
	ModeManaged ProxyMode = "Managed"
	// ModeExternal: the proxy already runs at spec.endpoint; the controller
	// never calls a provider for it and only probes its health.
	ModeExternal ProxyMode = "External"
)

// Defaults the API server applies; exported so code that builds objects
// without the API server (unit tests, the pool's static sources) agrees.
const (
	// DefaultPort is the port a Managed proxy's Squid listens on.
	DefaultPort int32 = 3128
	// DefaultHealthCheckIntervalSeconds is the time between two probes.
	DefaultHealthCheckIntervalSeconds int32 = 10
	// DefaultHealthCheckTimeoutSeconds bounds one probe.
	DefaultHealthCheckTimeoutSeconds int32 = 5
	// DefaultHealthCheckSuccessThreshold is how many probes in a row must
	// succeed before an unhealthy proxy turns healthy.
	DefaultHealthCheckSuccessThreshold int32 = 1
	// DefaultHealthCheckFailureThreshold is how many probes in a row must
	// fail before a healthy proxy turns unhealthy.
	DefaultHealthCheckFailureThreshold int32 = 3
	// DefaultHealthCheckExpectedStatus is the HTTP status a good probe gets.
	DefaultHealthCheckExpectedStatus int32 = 200
	// DefaultCloudInitSecretKey is the Secret key read when secretRef.key is empty.
	DefaultCloudInitSecretKey = "user-data"
)

// ProxySpec is the desired upstream proxy.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.mode) && self.mode == 'External') || has(self.endpoint)",message="mode External needs spec.endpoint (host and port of the existing proxy)"
// +kubebuilder:validation:XValidation:rule="!(has(self.mode) && self.mode == 'External') || !has(self.provider)",message="mode External must not set spec.provider: an External proxy is not provisioned by any provider"
// +kubebuilder:validation:XValidation:rule="!(has(self.mode) && self.mode == 'External') || (!has(self.placement) && !has(self.cloudInit))",message="mode External must not set spec.placement or spec.cloudInit: nothing is provisioned for an External proxy"
// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode == 'External') || has(self.provider)",message="mode Managed needs spec.provider, the name of an entry in the controller's providers config"
// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode == 'External') || !has(self.endpoint)",message="mode Managed must not set spec.endpoint: the provider reports the address; use mode External for a proxy that already runs"
type ProxySpec struct {
	// Mode is Managed (the controller provisions the instance through a
	// provider) or External (an existing proxy at spec.endpoint).
	// Immutable: switching a live Proxy between Managed and External would
	// leave a provisioned instance with nothing to clean it up.
	// (The rule lives on Proxy, not here, so a ProxyPool's template, which
	// embeds this spec, can change it: a pool rolls to new Proxies.)
	// +kubebuilder:default=Managed
	// +optional
	Mode ProxyMode `json:"mode,omitempty"`

	// Provider names an entry of the controller's providers config; required
	// for Managed, forbidden for External.
	// +kubebuilder:validation:MaxLength=63
	// Immutable: the instance's providerID only means something to the
	// provider that created it.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="provider must be a DNS-1123 label (lower-case letters, digits and '-'), the name of an entry in the providers config"
	// (Enforced on Proxy, as for mode.)
	// +optional
	Provider string `json:"provider,omitempty"`

	// Placement says where and on what a Managed instance runs; empty fields
	// take the provider's defaults.
	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// Port is the port the Managed proxy listens on.
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Endpoint is where an External proxy listens; required for External,
	// forbidden for Managed.
	// +optional
	Endpoint *Endpoint `json:"endpoint,omitempty"`

	// CloudInit is the user-data a Managed VM boots with: inline, or from a
	// Secret labelled proxyfleet.io/cloud-init: "true". Editing it, or
	// rotating the Secret, replaces the instance.
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// Attributes are free-form labels of the upstream (region, tier, ...)
	// that lease selectors and gateway username parameters match against.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`

	// HealthCheck says how the controller probes the proxy.
	// +kubebuilder:default={}
	// +optional
	HealthCheck HealthCheck `json:"healthCheck,omitempty"`
}

// Placement selects where a Managed instance runs. Which fields matter, and
// what an empty one means, is up to the provider.
type Placement struct {
	// Zone is the provider's zone or host (for example europe-west1-b).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Zone string `json:"zone,omitempty"`

	// MachineType is the provider's machine type or size (for example e2-micro).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	MachineType string `json:"machineType,omitempty"`

	// Image is the boot image (VM providers) or container image (kubernetes).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Image string `json:"image,omitempty"`
}

// Endpoint is the address of an External proxy.
type Endpoint struct {
	// Host is the proxy's host name or IP address, without scheme or port.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!self.contains('/') && !self.contains(' ')",message="endpoint.host is a host name or IP address, not a URL (no scheme, path or spaces)"
	// +kubebuilder:validation:XValidation:rule="!self.contains('@') && (!self.contains(':') || isIP(self))",message="endpoint.host is a host name or IP address without a port (set endpoint.port) or a login (set endpoint.credentialsSecretRef)"
	Host string `json:"host"`

	// Port is the proxy's port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// Scheme is how the proxy is spoken to: http (the default; CONNECT for
	// https targets), https (TLS to the proxy itself) or socks5. Health
	// probes and gateways use it alike.
	// +kubebuilder:validation:Enum=http;https;socks5
	// +optional
	Scheme string `json:"scheme,omitempty"`

	// CredentialsSecretRef names a Secret in the Proxy's namespace holding
	// the login the proxy demands, in the keys username and password. The
	// Secret must be labelled proxyfleet.io/credentials: "true": the
	// controller reads only labelled Secrets. Probes send the login, and
	// the lease API hands it, with the lease, to authenticated callers only.
	// +optional
	CredentialsSecretRef *SecretRef `json:"credentialsSecretRef,omitempty"`
}

// Endpoint schemes.
const (
	SchemeHTTP   = "http"
	SchemeHTTPS  = "https"
	SchemeSOCKS5 = "socks5"
)

// SecretRef names a Secret in the Proxy's namespace.
type SecretRef struct {
	// Name is the Secret's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="credentialsSecretRef.name must be a Secret name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	Name string `json:"name"`
}

// CloudInit is the user-data of a Managed VM, given inline or by reference.
// +kubebuilder:validation:XValidation:rule="has(self.inline) != has(self.secretRef)",message="cloudInit needs exactly one of inline or secretRef"
type CloudInit struct {
	// Inline is the user-data itself.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=262144
	// +optional
	Inline string `json:"inline,omitempty"`

	// SecretRef names a Secret in the Proxy's namespace that holds the
	// user-data. The Secret must carry the label proxyfleet.io/cloud-init: "true".
	// +optional
	SecretRef *SecretKeyRef `json:"secretRef,omitempty"`
}

// SecretKeyRef points at one key of a Secret in the Proxy's namespace.
type SecretKeyRef struct {
	// Name is the Secret's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="cloudInit.secretRef.name must be a Secret name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	Name string `json:"name"`

	// Key is the key in the Secret's data that holds the user-data.
	// +kubebuilder:default=user-data
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$')",message="cloudInit.secretRef.key must be a Secret key: letters, digits, '-', '_' and '.'"
	// +optional
	Key string `json:"key,omitempty"`
}

// HealthCheck configures the probes the controller sends through the proxy.
// Zero fields mean the defaults (the API server fills them in).
// +kubebuilder:validation:XValidation:rule="!has(self.timeoutSeconds) || self.timeoutSeconds <= (has(self.intervalSeconds) ? self.intervalSeconds : 10)",message="healthCheck.timeoutSeconds must not exceed healthCheck.intervalSeconds (default 10)"
type HealthCheck struct {
	// URL is fetched through the proxy; http:// is a plain proxied request,
	// https:// a CONNECT tunnel with TLS inside. Empty means the controller's
	// default probe URL.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="healthCheck.url must be an http:// or https:// URL"
	// +optional
	URL string `json:"url,omitempty"`

	// IntervalSeconds is the time between two probes.
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	IntervalSeconds int32 `json:"intervalSeconds,omitempty"`

	// TimeoutSeconds bounds one probe; at most intervalSeconds. Unset, it is
	// 5 or the interval when that is shorter: a Proxy probed every second
	// must not be refused over a timeout its author never wrote, so the API
	// server stores no default here and WithDefaults computes it.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// SuccessThreshold is how many probes in a row must succeed before an
	// unhealthy proxy is healthy again.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`

	// FailureThreshold is how many probes in a row must fail before a
	// healthy proxy is unhealthy.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`

	// ExpectedStatus is the HTTP status code a successful probe receives.
	// +kubebuilder:default=200
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	// +optional
	ExpectedStatus int32 `json:"expectedStatus,omitempty"`
}

// ProxyPhase is the one-word summary of a Proxy, computed by the controller
// from its conditions.
// +kubebuilder:validation:Enum=Pending;Provisioning;Ready;Unhealthy;Failed;Deleting
type ProxyPhase string

const (
	// PhasePending: accepted, nothing provisioned or probed yet.
	PhasePending ProxyPhase = "Pending"
	// PhaseProvisioning: the instance is being created or replaced.
	PhaseProvisioning ProxyPhase = "Provisioning"
	// PhaseReady: provisioned (or external) and passing health checks.
	PhaseReady ProxyPhase = "Ready"
	// PhaseUnhealthy: provisioned (or external) but failing health checks.
	PhaseUnhealthy ProxyPhase = "Unhealthy"
	// PhaseFailed: a permanent provider error (the controller waits for a
	// spec edit), or a provider the controller is not configured with.
	PhaseFailed ProxyPhase = "Failed"
	// PhaseDeleting: the object is being deleted and its instance cleaned up.
	PhaseDeleting ProxyPhase = "Deleting"
)

// Condition types of a Proxy.
const (
	// ConditionProvisioned is True when the instance exists with an address
	// (or the proxy is External); its reason says what the controller is doing.
	ConditionProvisioned = "Provisioned"
	// ConditionHealthy is the health engine's verdict from probes through the proxy.
	ConditionHealthy = "Healthy"
)

// Condition reasons of a Proxy. Provisioned uses the first group, Healthy the
// second.
const (
	// ReasonCreated: the instance runs and has an address.
	ReasonCreated = "Created"
	// ReasonProvisioning: the instance was requested and is not running yet.
	ReasonProvisioning = "Provisioning"
	// ReasonReplacing: the spec (or cloud-init Secret) changed; the old
	// instance is being deleted before a new one is created under the same name.
	ReasonReplacing = "Replacing"
	// ReasonRecreating: the instance vanished or stopped; it is deleted if
	// needed and created again (instances are cattle).
	ReasonRecreating = "Recreating"
	// ReasonCreateFailed: the provider accepted a create and the instance
	// vanished before it ever ran (a GCP zone out of capacity answers an
	// insert so); it is created again after a wait that grows with how long
	// the Proxy has been failing (phase Pending).
	ReasonCreateFailed = "CreateFailed"
	// ReasonDeleting: the Proxy is being deleted and the instance with it.
	ReasonDeleting = "Deleting"
	// ReasonExternalEndpoint: an External proxy; nothing to provision.
	ReasonExternalEndpoint = "ExternalEndpoint"
	// ReasonPermanentError: the provider refused in a way retries cannot fix;
	// latched until the spec changes (phase Failed).
	ReasonPermanentError = "PermanentError"
	// ReasonQuotaExceeded: the provider is out of quota; retried slowly,
	// never Failed.
	ReasonQuotaExceeded = "QuotaExceeded"
	// ReasonTransientError: a provider call failed and is retried with backoff.
	ReasonTransientError = "TransientError"
	// ReasonCloudInitError: the cloud-init Secret is missing, unlabelled or
	// lacks the key.
	ReasonCloudInitError = "CloudInitError"
	// ReasonCredentialsError: the generated proxy login could not be read or
	// created (its Secret is foreign, broken or not writable).
	ReasonCredentialsError = "CredentialsError"
	// ReasonProviderNotConfigured: spec.provider names no configured provider
	// (or the controller runs without a providers config).
	ReasonProviderNotConfigured = "ProviderNotConfigured"

	// ReasonProbeSucceeded: the last threshold run of probes succeeded.
	ReasonProbeSucceeded = "ProbeSucceeded"
	// ReasonProbeFailed: the last threshold run of probes failed.
	ReasonProbeFailed = "ProbeFailed"
)

// Well-known annotations, labels and the finalizer.
const (
	// Finalizer holds a Managed Proxy until its instance is deleted.
	Finalizer = "proxyfleet.io/cleanup"
	// AnnotationSkipCleanup set to "true" releases a Proxy being deleted
	// without deleting its instance (left for a human or the orphan GC).
	AnnotationSkipCleanup = "proxyfleet.io/skip-cleanup"
	// AnnotationSpecHash records the hash of the spec (and cloud-init) the
	// current instance was created from; a mismatch triggers replacement.
	AnnotationSpecHash = "proxyfleet.io/spec-hash"
	// LabelCloudInit set to "true" marks a Secret usable as cloud-init; the
	// controller caches and reads only Secrets with it.
	LabelCloudInit = "proxyfleet.io/cloud-init"
	// LabelUID on a provider instance names the UID of the owning Proxy, so
	// the orphan GC can tell which instances no Proxy owns any more.
	LabelUID = "proxyfleet.io/uid"
	// LabelManagedBy marks what proxyfleet created (instances, ProviderHealth).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of LabelManagedBy on proxyfleet's objects.
	ManagedByValue = "proxyfleet"
	// LabelInject set to "true" on a Pod or Namespace opts into gateway
	// sidecar injection.
	LabelInject = "proxyfleet.io/inject"
	// ValueTrue is the value the boolean labels and annotations above expect.
	ValueTrue = "true"
)

// ProxyStatus is what the controller observed. The controller is its only
// writer.
type ProxyStatus struct {
	// Phase summarises the conditions.
	// +optional
	Phase ProxyPhase `json:"phase,omitempty"`

	// IP is the proxy's address: the instance's IP for Managed, the
	// endpoint host for External.
	// +optional
	IP string `json:"ip,omitempty"`

	// ProviderID identifies the instance at its provider.
	// +optional
	ProviderID string `json:"providerID,omitempty"`

	// LatencyMillis is the round-trip time of the last status-affecting probe.
	// +optional
	LatencyMillis int64 `json:"latencyMillis,omitempty"`

	// LastHealthCheckTime is when the last status-affecting probe ran
	// (probes that change nothing do not write status).
	// +optional
	LastHealthCheckTime *metav1.Time `json:"lastHealthCheckTime,omitempty"`

	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Provisioned and Healthy.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Proxy is one upstream egress proxy: provisioned by the controller through a
// provider (Managed) or already running somewhere (External), and
// health-checked either way.
//
// The immutability rules of spec.mode and spec.provider are on the object,
// not on ProxySpec, because ProxyPool's template embeds ProxySpec and a
// template edit must stay possible.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=px
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.mode) || !has(self.spec.mode) || self.spec.mode == oldSelf.spec.mode",message="spec.mode is immutable: create a new Proxy to switch between Managed and External",fieldPath=".spec.mode"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.provider) || !has(self.spec.provider) || self.spec.provider == oldSelf.spec.provider",message="spec.provider is immutable: the instance belongs to the provider that created it; create a new Proxy to move it",fieldPath=".spec.provider"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Latency",type=integer,JSONPath=`.status.latencyMillis`,description="round-trip time of the last status-affecting probe, in milliseconds"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`,priority=1
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired proxy.
	// +kubebuilder:validation:Required
	Spec ProxySpec `json:"spec,omitempty"`
	// Status is what the controller observed.
	// +optional
	Status ProxyStatus `json:"status,omitempty"`
}

// ProxyList is a list of Proxy objects.
//
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Proxies.
	Items []Proxy `json:"items"`
}

// Credentials Secrets: the per-Proxy login of a Managed VM's bootstrap Squid.
const (
	// LabelCredentials set to "true" marks a Secret holding an upstream
	// proxy's login (keys CredentialsUsernameKey and CredentialsPasswordKey).
	LabelCredentials = "proxyfleet.io/credentials"
	// CredentialsUsernameKey and CredentialsPasswordKey are the data keys of
	// a credentials Secret.
	CredentialsUsernameKey = "username"
	CredentialsPasswordKey = "password"
)
