// Package v1alpha1 holds the proxyfleet.io/v1alpha1 API: the Proxy an
// operator declares (a managed or external upstream egress proxy), the
// ProxyPool that keeps a number of them from a template, the ProxyGrant
// that shares a namespace's Proxies with other namespaces, and the
// status-only ProviderHealth the controller publishes per configured provider.
//
// The types carry the kubebuilder markers that `make generate` turns into the
// deepcopy functions and the CRDs in charts/proxyfleet/crds/. The package has
// no init() and no registry: callers add the types to their own scheme with
// AddToScheme.
//
// +kubebuilder:object:generate=true
// +groupName=proxyfleet.io
//
// It imports apimachinery only, nothing of proxyfleet: every other package
// may import it.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// Group is the API group of every proxyfleet type.
	Group = "proxyfleet.io"
	// Version is the API version of this package.
	Version = "v1alpha1"
)

// GroupVersion is proxyfleet.io/v1alpha1, for schemes, REST mappings and
// owner references.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// AddToScheme registers Proxy, ProxyPool, ProviderHealth, ProxyGrant and their lists with s. It is a
// plain function so wiring stays explicit at the composition root.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Proxy{}, &ProxyList{},
		&ProxyPool{}, &ProxyPoolList{},
		&ProviderHealth{}, &ProviderHealthList{},
		&ProxyGrant{}, &ProxyGrantList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
