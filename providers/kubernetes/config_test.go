package kubernetes

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfigDocsExample(t *testing.T) {
	// The kubernetes entry of the example in docs/providers.md.
	cfg, err := parse(`
providers:
  - name: in-cluster          # what Proxy.spec.provider names; DNS-1123
    type: kubernetes
    kubernetes:
      namespace: proxyfleet-egress
      image: ubuntu/squid:6.6-24.04_beta
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	if want := (Config{Namespace: "proxyfleet-egress", Image: "ubuntu/squid:6.6-24.04_beta"}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig = %+v, %v; want %+v", got, err, want)
	}
}

func TestReadConfig(t *testing.T) {
	cfg, err := parse(`
providers:
  - name: pods
    type: kubernetes
    kubernetes: {namespace: egress, clusterCIDRs: [203.0.113.0/24, "2001:db8:1::/48"], clientCIDRs: [10.0.0.0/8]}
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	if got.Namespace != "egress" || got.Image != "" || len(got.ClusterCIDRs) != 2 || got.ClusterCIDRs[0] != netip.MustParsePrefix("203.0.113.0/24") ||
		got.ClusterCIDRs[1] != netip.MustParsePrefix("2001:db8:1::/48") {
		t.Fatalf("ReadConfig = %+v", got)
	}
	if clients := squidconf.JoinPrefixes(got.clientCIDRs()); clients != "10.0.0.0/8 203.0.113.0/24 2001:db8:1::/48" {
		t.Fatalf("clients = %s: configured clients plus cluster CIDRs", clients)
	}
	if _, err := ReadConfig(providers.Entry{Name: "gcp-eu", Type: "gcp"}); err == nil {
		t.Fatal("ReadConfig accepted a gcp entry")
	}
	if squidconf.JoinPrefixes((Config{}).clientCIDRs()) != squidconf.JoinPrefixes(DefaultClientCIDRs()) {
		t.Fatal("empty ClientCIDRs does not default to the private ranges")
	}
}

func TestReadConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // each must appear in the error
	}{
		{"unknown key in the block", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: egress, imagee: x}}]",
			[]string{"providers[0] (a): kubernetes.imagee: unknown field"}},
		{"namespace required", "providers: [{name: a, type: kubernetes, kubernetes: {image: x}}]", []string{"providers[0] (a): kubernetes.namespace is required"}},
		{"namespace invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: Egress}}]",
			[]string{`providers[0] (a): kubernetes.namespace "Egress" is not a DNS-1123 label`}},
		{"image invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, image: 'ubuntu/squid latest'}}]",
			[]string{`providers[0] (a): kubernetes.image "ubuntu/squid latest" is not an image reference`}},
		{"CIDR invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, clusterCIDRs: [10.0.0.0/33]}}]",
			[]string{`providers[0] (a): kubernetes.clusterCIDRs[0] "10.0.0.0/33" is not a CIDR`}},
		{"CIDR with host bits", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, clientCIDRs: [10.1.2.3/8]}}]",
			[]string{`providers[0] (a): kubernetes.clientCIDRs[0] "10.1.2.3/8" has host bits set (did you mean 10.0.0.0/8?)`}},
		{"every problem at once, sorted", "providers: [{name: a, type: kubernetes, kubernetes: {image: 'a b', clusterCIDRs: [x], clientCIDRs: [y]}}]",
			[]string{`providers[0] (a): kubernetes.image "a b" is not an image reference` + "\nproviders[0] (a): kubernetes.namespace is required",
				`providers[0] (a): kubernetes.clusterCIDRs[0] "x" is not a CIDR`, `providers[0] (a): kubernetes.clientCIDRs[0] "y" is not a CIDR`}},
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

// FuzzReadConfig feeds a providers config file of kubernetes entries
// (outside input): it never panics, and every entry it accepts makes a
// provider (New refuses nothing ReadConfig let through) with canonical CIDRs.
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("providers: [{name: a, type: kubernetes, kubernetes: {namespace: egress, image: ubuntu/squid:6.6-24.04_beta}}]"))
	f.Add([]byte("providers:\n- name: a\n  type: kubernetes\n  kubernetes:\n    namespace: e\n    clusterCIDRs: [203.0.113.0/24, '2001:db8:1::/48']\n    clientCIDRs: [10.1.2.3/8]\n"))
	f.Add([]byte("providers: [{name: a, type: kubernetes, kubernetes: {namespace: Egress, image: 'a b', imagee: x}}]"))
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
			if _, err := New(struct{ client.Client }{}, got); err != nil {
				t.Fatalf("New refuses an accepted entry in %q: %v", in, err)
			}
			for _, p := range append(got.ClusterCIDRs, got.ClientCIDRs...) {
				if p != p.Masked() {
					t.Fatalf("accepted a CIDR with host bits: %v in %q", p, in)
				}
			}
		}
	})
}
