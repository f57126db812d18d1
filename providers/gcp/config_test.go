package gcp

import (
	"context"
	"reflect"
	"strings"
	"testing"

	compute "cloud.google.com/go/compute/apiv1"
	"google.golang.org/api/option"

	"github.com/proxyfleet/proxyfleet/internal/testkit/computeapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfigDocsExample(t *testing.T) {
	// The gcp entry of the example in docs/providers.md.
	cfg, err := parse(`
providers:
  - name: gcp-eu
    type: gcp
    gcp: {project: my-project, defaults: {zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}}
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	want := Config{Project: "my-project", AddressType: AddressExternal, Defaults: providers.Placement{
		Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig = %+v, %v; want %+v", got, err, want)
	}
	if _, err := ReadConfig(providers.Entry{Name: "pods", Type: "kubernetes"}); err == nil {
		t.Fatal("ReadConfig accepted a kubernetes entry")
	}
}

// TestConstructorUsesTheBlocksClientOptions builds a provider as the binary
// does, from the file, against the in-test Compute API: endpoint and noAuth
// reach the client.
func TestConstructorUsesTheBlocksClientOptions(t *testing.T) {
	srv := computeapi.Start(t, testProject)
	cfg, err := parse("providers: [{name: g, type: gcp, gcp: {project: " + testProject + ", addressType: internal, noAuth: true, endpoint: '" + srv.URL + "'}}]")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Constructor(context.Background())(cfg.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*Provider).cfg.AddressType; got != AddressInternal {
		t.Fatalf("addressType = %q, want internal", got)
	}
	if _, err := p.ListByTag(context.Background()); err != nil {
		t.Fatalf("ListByTag through the configured endpoint: %v", err)
	}
}

func TestReadConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // each must appear in the error
	}{
		{"unknown key nested deep", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zonee: x}}}]",
			[]string{"providers[0] (g): gcp.defaults.zonee: unknown field"}},
		{"wrong value type", "providers: [{name: g, type: gcp, gcp: {project: [a]}}]", []string{"providers[0] (g): gcp.project: want a string, got array"}},
		{"project required", "providers: [{name: gcp-eu, type: gcp, gcp: {defaults: {zone: europe-west1-b}}}]", []string{"providers[0] (gcp-eu): gcp.project is required"}},
		{"project invalid", "providers: [{name: g, type: gcp, gcp: {project: My_Project}}]", []string{`providers[0] (g): gcp.project "My_Project" is not a project ID`}},
		{"zone invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zone: europe}}}]", []string{`providers[0] (g): gcp.defaults.zone "europe" is not a zone`}},
		{"address type unknown", "providers: [{name: g, type: gcp, gcp: {project: my-project, addressType: public}}]",
			[]string{`providers[0] (g): gcp.addressType "public" is not external or internal`}},
		{"network tag invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, networkTags: [Squid_Port]}}]",
			[]string{`providers[0] (g): gcp.networkTags[0] "Squid_Port" is not a network tag`}},
		{"network tag too long", "providers: [{name: g, type: gcp, gcp: {project: my-project, networkTags: [" + strings.Repeat("a", 64) + "]}}]",
			[]string{`providers[0] (g): gcp.networkTags[0] "` + strings.Repeat("a", 64) + `" is not a network tag`}},
		{"label key invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, labels: {Team: x}}}]",
			[]string{"providers[0] (g): gcp.labels[Team]: the key is not a GCP label key"}},
		{"label value invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, labels: {team: Web.Crawl}}}]",
			[]string{`providers[0] (g): gcp.labels[team]: the value "Web.Crawl" is not a GCP label value`}},
		{"credentials file relative", "providers: [{name: g, type: gcp, gcp: {project: my-project, credentialsFile: key.json}}]",
			[]string{`providers[0] (g): gcp.credentialsFile "key.json" must be an absolute path`}},
		{"endpoint not a URL", "providers: [{name: g, type: gcp, gcp: {project: my-project, endpoint: compute.example}}]",
			[]string{"providers[0] (g): gcp.endpoint is not an http(s) base URL"}},
		{"noAuth with a credentials file", "providers: [{name: g, type: gcp, gcp: {project: my-project, noAuth: true, credentialsFile: /k.json}}]",
			[]string{"providers[0] (g): gcp.noAuth and gcp.credentialsFile are mutually exclusive"}},
		{"service account not an e-mail", "providers: [{name: g, type: gcp, gcp: {project: my-project, serviceAccount: squid}}]",
			[]string{`providers[0] (g): gcp.serviceAccount "squid" is not a service account e-mail`}},
		{"machine type invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {machineType: E2 Micro}}}]",
			[]string{`providers[0] (g): gcp.defaults.machineType "E2 Micro" is not a machine type`}},
		{"whitespace in image and networks", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {image: 'a b'}, network: 'n 1', subnetwork: 's 1'}}]",
			[]string{`providers[0] (g): gcp.defaults.image "a b" contains whitespace`, `providers[0] (g): gcp.network "n 1" contains whitespace`,
				`providers[0] (g): gcp.subnetwork "s 1" contains whitespace`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parse(tt.yaml)
			if err == nil {
				t.Fatalf("ParseConfig accepted it: %+v", cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// FuzzReadConfig feeds a providers config file of gcp entries (outside
// input): it never panics, and every entry it accepts makes a provider
// (New refuses nothing ReadConfig let through) whose labels Create can use.
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}}}]"))
	f.Add([]byte("providers:\n- name: g\n  type: gcp\n  gcp:\n    project: my-project\n    networkTags: [squid]\n    addressType: internal\n    labels: {team: crawl}\n    endpoint: http://127.0.0.1:1\n    noAuth: true\n"))
	f.Add([]byte("providers: [{name: g, type: gcp, gcp: {project: My_Project, labels: {Team: Web.Crawl}, credentialsFile: k, noAuth: true}}]"))
	c, err := compute.NewInstancesRESTClient(context.Background(), option.WithEndpoint("http://127.0.0.1:1"), option.WithoutAuthentication())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = c.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := parse(string(in))
		if err != nil {
			return
		}
		for _, e := range cfg.Providers {
			got, err := ReadConfig(e)
			if err != nil {
				t.Fatalf("ParseConfig accepted what ReadConfig refuses: %v", err)
			}
			if _, err := New(c, got); err != nil {
				t.Fatalf("New refuses an accepted entry in %q: %v", in, err)
			}
			for k, v := range got.Labels {
				if !labelKey.MatchString(k) || !labelValue.MatchString(v) {
					t.Fatalf("accepted a label Create refuses: %s=%q in %q", k, v, in)
				}
			}
		}
	})
}
