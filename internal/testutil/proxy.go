package testutil

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// ProxyModifier changes a Proxy that Proxy builds.
type ProxyModifier func(*v1alpha1.Proxy)

// Proxy is the one Proxy builder of the tests, in the manner of
// cert-manager's test/unit/gen: an External Proxy named name in namespace
// "default" at 127.0.0.1:3128 (External needs no provider), changed by each
// modifier in order. A nil modifier is skipped.
func Proxy(name string, mods ...ProxyModifier) *v1alpha1.Proxy {
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.ProxySpec{
			Mode:     v1alpha1.ModeExternal,
			Endpoint: &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 3128},
		},
	}
	for _, m := range mods {
		if m != nil {
			m(p)
		}
	}
	return p
}

// SetProxyNamespace puts the Proxy in namespace ns.
func SetProxyNamespace(ns string) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Namespace = ns }
}

// SetProxyEndpoint points an External Proxy at host:port.
func SetProxyEndpoint(host string, port int32) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.Endpoint = &v1alpha1.Endpoint{Host: host, Port: port} }
}

// SetProxyFinalizers sets the Proxy's finalizers (they keep it around after
// a delete).
func SetProxyFinalizers(finalizers ...string) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Finalizers = finalizers }
}

// SetProxyAttributes sets spec.attributes.
func SetProxyAttributes(attrs map[string]string) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.Attributes = attrs }
}

// SetProxyHealthCheck sets spec.healthCheck.
func SetProxyHealthCheck(hc v1alpha1.HealthCheck) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.HealthCheck = hc }
}
