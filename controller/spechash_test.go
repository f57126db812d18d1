package controller

import (
	"testing"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestSpecHashCoversWhatShapesTheInstance(t *testing.T) {
	base := func() *v1alpha1.Proxy {
		return &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{
			Mode: v1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
			Placement: &v1alpha1.Placement{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "debian-12"},
		}}
	}
	ref := specHash(base(), []byte("#cloud-config\n"), "")
	tests := []struct {
		name      string
		edit      func(p *v1alpha1.Proxy)
		cloudInit string
		changes   bool
	}{
		{name: "nothing changed", edit: func(*v1alpha1.Proxy) {}, cloudInit: "#cloud-config\n"},
		{name: "zone", edit: func(p *v1alpha1.Proxy) { p.Spec.Placement.Zone = "europe-west4-a" }, cloudInit: "#cloud-config\n", changes: true},
		{name: "machine type", edit: func(p *v1alpha1.Proxy) { p.Spec.Placement.MachineType = "e2-small" }, cloudInit: "#cloud-config\n", changes: true},
		{name: "image", edit: func(p *v1alpha1.Proxy) { p.Spec.Placement.Image = "debian-13" }, cloudInit: "#cloud-config\n", changes: true},
		{name: "port", edit: func(p *v1alpha1.Proxy) { p.Spec.Port = 8080 }, cloudInit: "#cloud-config\n", changes: true},
		{name: "provider", edit: func(p *v1alpha1.Proxy) { p.Spec.Provider = "gcp-us" }, cloudInit: "#cloud-config\n", changes: true},
		{name: "cloud-init content (Secret rotation)", edit: func(*v1alpha1.Proxy) {}, cloudInit: "#cloud-config\nruncmd: []\n", changes: true},
		{name: "attributes do not", edit: func(p *v1alpha1.Proxy) { p.Spec.Attributes = map[string]string{"tier": "dc"} }, cloudInit: "#cloud-config\n"},
		{name: "health check does not", edit: func(p *v1alpha1.Proxy) { p.Spec.HealthCheck.URL = "https://example.org/" }, cloudInit: "#cloud-config\n"},
		{name: "unset port equals the default", edit: func(p *v1alpha1.Proxy) { p.Spec.Port = 0 }, cloudInit: "#cloud-config\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := base()
			tc.edit(p)
			got := specHash(p, []byte(tc.cloudInit), "")
			if (got != ref) != tc.changes {
				t.Errorf("hash changed = %v, want %v", got != ref, tc.changes)
			}
		})
	}
}
