package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionReady is the ProviderHealth condition that is True when every
// target of the provider is ready.
const ConditionReady = "Ready"

// ProviderHealthStatus is the result of the latest check of one provider.
type ProviderHealthStatus struct {
	// Type is the provider's type from the providers config (kubernetes, gcp, kvm, ...).
	// +optional
	Type string `json:"type,omitempty"`

	// Ready is true when every target passed the latest check.
	// +optional
	Ready bool `json:"ready"`

	// TargetsReady counts the ready targets as "ready/total" (for example
	// "1/1"), for kubectl get.
	// +optional
	TargetsReady string `json:"targetsReady,omitempty"`

	// Targets holds one verdict per thing the provider depends on (an API
	// endpoint, a project, a hypervisor host).
	// +listType=map
	// +listMapKey=name
	// +optional
	Targets []ProviderTarget `json:"targets,omitempty"`

	// LastCheckTime is when the latest check finished.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`

	// Conditions holds Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProviderTarget is the verdict for one target of a provider.
type ProviderTarget struct {
	// Name identifies the target within the provider (for example "apiserver"
	// or a host name).
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Ready is true when the latest check of this target passed.
	Ready bool `json:"ready"`

	// Reason is a CamelCase word for why the target is (not) ready.
	// +optional
	Reason string `json:"reason,omitempty"`

	// Message is the human-readable detail of Reason.
	// +optional
	Message string `json:"message,omitempty"`

	// Details are provider-specific facts from the check (versions, capacity, ...).
	// +optional
	Details map[string]string `json:"details,omitempty"`

	// LastTransitionTime is when Ready last flipped; it survives checks in
	// which Ready stays the same.
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
}

// ProviderHealth reports whether the controller can reach one configured
// provider's backend. The controller creates one per provider, named after
// it, and is its only writer; it has no spec because the providers config is
// the one place providers are configured.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ph
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.status.type`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Targets",type=string,JSONPath=`.status.targetsReady`
// +kubebuilder:printcolumn:name="Last Check",type=date,JSONPath=`.status.lastCheckTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProviderHealth struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is the latest check's result.
	// +optional
	Status ProviderHealthStatus `json:"status,omitempty"`
}

// ProviderHealthList is a list of ProviderHealth objects.
//
// +kubebuilder:object:root=true
type ProviderHealthList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the ProviderHealth objects.
	Items []ProviderHealth `json:"items"`
}
