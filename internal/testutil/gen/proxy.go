// Package gen owns the test builders of our API objects, in the manner of
// cert-manager's test/unit/gen: gen.Proxy("name", gen.SetProxyNamespace(ns),
// gen.SetProxyProvider("kvm"), ...) starts from a small valid object and
// applies functional options in order, so a test states only the fields
// it is about. Each builder starts from the same base every time; a
// modifier sets one field group and nothing else, so an object built here
// is the one a literal with the same fields would be.
//
// It imports api/v1alpha1 and apimachinery's meta types only and must not
// import internal/testutil, a controller or provider package, or anything
// that starts real parts, so that any test package can use it.
package gen

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// ProxyModifier changes a Proxy that Proxy builds.
type ProxyModifier func(*v1alpha1.Proxy)

// Proxy builds an External Proxy named name in namespace "default" at
// 127.0.0.1:3128 (External needs no provider), changed by each modifier in
// order. A nil modifier is skipped.
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

// SetProxyEndpoint points an External Proxy at host:port (plain HTTP, no
// login).
func SetProxyEndpoint(host string, port int32) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.Endpoint = &v1alpha1.Endpoint{Host: host, Port: port} }
}

// SetProxyProvider makes the Proxy one of the named provider, with no
// endpoint (the provider's instance is the endpoint) and no mode: the API
// server defaults it to Managed, and the controller reads an empty mode as
// Managed, as a user's manifest that names only a provider is.
func SetProxyProvider(provider string) ProxyModifier {
	return func(p *v1alpha1.Proxy) {
		p.Spec.Mode = ""
		p.Spec.Provider = provider
		p.Spec.Endpoint = nil
	}
}

// SetProxyManaged is SetProxyProvider with mode Managed spelled out, for
// tests that build the object the API server would have defaulted.
func SetProxyManaged(provider string) ProxyModifier {
	return func(p *v1alpha1.Proxy) {
		SetProxyProvider(provider)(p)
		p.Spec.Mode = v1alpha1.ModeManaged
	}
}

// SetProxyPort sets spec.port, the port Squid listens on in a Managed
// Proxy's instance.
func SetProxyPort(port int32) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.Port = port }
}

// SetProxyPlacement sets spec.placement.
func SetProxyPlacement(pl v1alpha1.Placement) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.Placement = &pl }
}

// SetProxyCloudInit sets spec.cloudInit to the inline user-data.
func SetProxyCloudInit(inline string) ProxyModifier {
	return func(p *v1alpha1.Proxy) { p.Spec.CloudInit = &v1alpha1.CloudInit{Inline: inline} }
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
