package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyGrant condition and its reasons.
const (
	// ConditionResolved on a ProxyGrant says whether everything it names
	// exists: the namespaces of spec.to and the pools of spec.pools. The API
	// server cannot check that (a CRD validates one object), so the
	// controller does, and says False with the names missing. A grant that
	// is not Resolved still applies to what does exist, and to a missing
	// namespace from the moment it is created.
	ConditionResolved = "Resolved"
	// ReasonAllFound: every namespace and pool the grant names exists.
	ReasonAllFound = "AllFound"
	// ReasonNamespaceNotFound: a namespace of spec.to does not exist.
	ReasonNamespaceNotFound = "NamespaceNotFound"
	// ReasonPoolNotFound: a pool of spec.pools does not exist in the
	// grant's namespace (every namespace of spec.to does).
	ReasonPoolNotFound = "PoolNotFound"
)

// ProxyGrantSpec says who may lease which Proxies of the grant's namespace.
type ProxyGrantSpec struct {
	// To lists who may lease, besides the grant's own namespace: pods
	// whose service-account token reviews to one of these namespaces.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	To []GrantSubject `json:"to"`

	// Pools names the ProxyPools of this namespace whose Proxies are
	// shared. Empty shares every Proxy of the namespace, those of no pool
	// included.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Pools []string `json:"pools,omitempty"`
}

// GrantSubject is one party a ProxyGrant shares with. Today a namespace
// (a pod identity's); a client of a token is the next kind, as one more
// field of which exactly one is set.
type GrantSubject struct {
	// Namespace whose pods may lease (by their projected service-account
	// token, as the lease API's token review reads it).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="to.namespace must be a namespace name: a DNS-1123 label (lower-case letters, digits and '-')"
	Namespace string `json:"namespace"`
}

// ProxyGrantStatus is what the controller observed of a grant.
type ProxyGrantStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Resolved.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ProxyGrant lets pods of other namespaces lease Proxies of its own
// namespace from the controller's lease API, as Gateway API's
// ReferenceGrant lets routes of other namespaces reference a Service: the
// owner of the egress declares it in the namespace that holds the egress,
// and nothing a consumer writes can. Without a grant a pod leases only
// Proxies of its own namespace (docs/tenancy.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pxg
// +kubebuilder:printcolumn:name="To",type=string,JSONPath=`.spec.to[*].namespace`
// +kubebuilder:printcolumn:name="Pools",type=string,JSONPath=`.spec.pools`
// +kubebuilder:printcolumn:name="Resolved",type=string,JSONPath=`.status.conditions[?(@.type=="Resolved")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is who may lease what.
	// +kubebuilder:validation:Required
	Spec ProxyGrantSpec `json:"spec"`
	// Status is what the controller observed.
	// +optional
	Status ProxyGrantStatus `json:"status,omitempty"`
}

// ProxyGrantList is a list of ProxyGrant objects.
//
// +kubebuilder:object:root=true
type ProxyGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the grants.
	Items []ProxyGrant `json:"items"`
}

// SharesWith reports whether spec.to names namespace ns.
func (g *ProxyGrant) SharesWith(ns string) bool {
	for _, s := range g.Spec.To {
		if s.Namespace == ns {
			return true
		}
	}
	return false
}

// Shares reports whether the grant lets namespace ns lease a Proxy of the
// grant's namespace that belongs to pool (empty: a Proxy of no pool).
func (g *ProxyGrant) Shares(ns, pool string) bool {
	if !g.SharesWith(ns) {
		return false
	}
	return len(g.Spec.Pools) == 0 || pool != "" && slices.Contains(g.Spec.Pools, pool)
}
