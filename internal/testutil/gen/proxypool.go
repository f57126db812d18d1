package gen

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// ProxyPoolModifier changes a ProxyPool that ProxyPool builds.
type ProxyPoolModifier func(*v1alpha1.ProxyPool)

// ProxyPool builds a ProxyPool named name in namespace "default" with an
// empty template and no replica count (the API's default applies), changed
// by each modifier in order. A nil modifier is skipped.
func ProxyPool(name string, mods ...ProxyPoolModifier) *v1alpha1.ProxyPool {
	p := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	for _, m := range mods {
		if m != nil {
			m(p)
		}
	}
	return p
}

// SetProxyPoolNamespace puts the pool in namespace ns.
func SetProxyPoolNamespace(ns string) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Namespace = ns }
}

// SetProxyPoolReplicas sets spec.replicas.
func SetProxyPoolReplicas(n int32) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = &n }
}

// SetProxyPoolDrainSeconds sets spec.drainSeconds.
func SetProxyPoolDrainSeconds(s int32) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Spec.DrainSeconds = &s }
}

// SetProxyPoolRecycle sets spec.recycle.
func SetProxyPoolRecycle(r v1alpha1.PoolRecycle) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Spec.Recycle = &r }
}

// SetProxyPoolTemplate sets the spec of the Proxies the pool makes.
func SetProxyPoolTemplate(spec v1alpha1.ProxySpec) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec = spec }
}

// SetProxyPoolTemplateLabels sets the labels of the Proxies the pool makes.
func SetProxyPoolTemplateLabels(labels map[string]string) ProxyPoolModifier {
	return func(p *v1alpha1.ProxyPool) { p.Spec.Template.Metadata.Labels = labels }
}
