package providers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// docsExample is the providers config shown in docs/providers.md.
const docsExample = `
providers:
  - name: in-cluster          # what Proxy.spec.provider names; DNS-1123
    type: kubernetes
    kubernetes:
      namespace: proxyfleet-egress
      image: ubuntu/squid:6.6-24.04_beta
  - name: gcp-eu
    type: gcp
    gcp: {project: my-project, defaults: {zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}}
`

// stubBlock stands in for a provider package's block: these tests are about
// the file's shape, which this package owns; each provider package tests its
// own block.
type stubBlock struct {
	Namespace string     `json:"namespace,omitempty"`
	Project   string     `json:"project,omitempty"`
	Image     string     `json:"image,omitempty"`
	Defaults  *Placement `json:"defaults,omitempty"`
	// Fail are problems the decoder reports, each as "<type>.<fail>".
	Fail []string `json:"fail,omitempty"`
}

func decodeStub(e Entry) (stubBlock, error) {
	var b stubBlock
	if err := e.Decode(e.Type, &b); err != nil {
		return stubBlock{}, err
	}
	var errs []error
	for _, f := range b.Fail {
		errs = append(errs, fmt.Errorf("%s.%s", e.Type, f))
	}
	return b, errors.Join(errs...)
}

// testTypes are the three types of the binary, with the stub decoder.
var testTypes = map[string]Decoder{"kubernetes": DecoderOf(decodeStub), "gcp": DecoderOf(decodeStub), "kvm": DecoderOf(decodeStub)}

func TestParseConfigIssueExample(t *testing.T) {
	cfg, err := ParseConfig([]byte(docsExample), testTypes)
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	var got []string
	var blocks []stubBlock
	for _, e := range cfg.Providers {
		got = append(got, e.Name+"/"+e.Type)
		b, err := decodeStub(e)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
	}
	if want := []string{"in-cluster/kubernetes", "gcp-eu/gcp"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	want := []stubBlock{{Namespace: "proxyfleet-egress", Image: "ubuntu/squid:6.6-24.04_beta"},
		{Project: "my-project", Defaults: &Placement{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"}}}
	if !reflect.DeepEqual(blocks, want) {
		t.Fatalf("blocks %+v, want %+v: each entry keeps the block of its type", blocks, want)
	}
}

func TestParseConfigEmptyIsNoProviders(t *testing.T) {
	for _, in := range []string{"", "providers: []", "providers:"} {
		cfg, err := ParseConfig([]byte(in), testTypes)
		if err != nil || len(cfg.Providers) != 0 {
			t.Fatalf("ParseConfig(%q) = %+v, %v; want no providers, no error", in, cfg, err)
		}
	}
}

func TestParseConfigRejects(t *testing.T) {
	const k8s = "kubernetes: {namespace: egress}"
	tests := []struct {
		name string
		yaml string
		want []string // each must appear in the error
	}{
		{"unknown top-level key", "provider: []", []string{`unknown field "provider"`}},
		{"providers not a list", "providers: {a: 1}", []string{"providers must be a list"}},
		{"entry not a mapping", "providers: [foo]", []string{"providers[0]: an entry must be a mapping"}},
		{"missing name", "providers: [{type: kubernetes, " + k8s + "}]", []string{"providers[0]: name is required"}},
		{"name not DNS-1123", "providers: [{name: In_Cluster, type: kubernetes, " + k8s + "}]", []string{`providers[0] (In_Cluster): name "In_Cluster" is not a DNS-1123 label`}},
		{"duplicate name", "providers: [{name: a, type: kubernetes, " + k8s + "}, {name: a, type: kubernetes, " + k8s + "}]",
			[]string{`providers[1] (a): name "a" is already used by providers[0]`}},
		{"missing type", "providers: [{name: a, " + k8s + "}]", []string{"providers[0] (a): type is required"}},
		{"unknown type", "providers: [{name: a, type: aws}]", []string{`providers[0] (a): type "aws" is unknown (want one of gcp, kubernetes, kvm)`}},
		{"missing block for type", "providers: [{name: a, type: kubernetes}]", []string{"providers[0] (a): kubernetes block is required for type kubernetes"}},
		{"a null block is no block", "providers: [{name: a, type: kubernetes, kubernetes: ~}]", []string{"providers[0] (a): kubernetes block is required for type kubernetes"}},
		{"block of another type", "providers: [{name: a, type: kubernetes, " + k8s + ", gcp: {project: my-project}}]",
			[]string{`providers[0] (a): gcp block is not allowed for type "kubernetes"`}},
		{"unknown key in entry", "providers: [{name: a, type: kubernetes, " + k8s + ", zone: x}]", []string{"providers[0] (a): zone: unknown field (line 1)"}},
		{"the block of an unknown type is an unknown key", "providers: [{name: a, type: aws, aws: {}}]", []string{"providers[0] (a): aws: unknown field"}},
		{"unknown key in a block", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: egress, imagee: x}}]",
			[]string{"providers[0] (a): kubernetes.imagee: unknown field"}},
		{"unknown key nested deep", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zonee: x}}}]",
			[]string{"providers[0] (g): gcp.defaults.zonee: unknown field"}},
		{"wrong value type", "providers: [{name: g, type: gcp, gcp: {project: [a]}}]", []string{"providers[0] (g): gcp.project: want a string, got array"}},
		{"a block that is not a mapping", "providers: [{name: g, type: gcp, gcp: my-project}]", []string{"providers[0] (g): gcp: want a mapping, got string (line 1)"}},
		{"a name that is not a string", "providers: [{name: [a], type: gcp}]", []string{"providers[0]: name: want a string, got array (line 1)"}},
		{"duplicate key", "providers: [{name: a, name: b}]", []string{"already set"}},
		{"every problem of a block, one per line", "providers: [{name: a, type: kvm, kvm: {fail: [ssh.user is required, hosts needs at least one host]}}]",
			[]string{"providers[0] (a): kvm.ssh.user is required\nproviders[0] (a): kvm.hosts needs at least one host"}},
		{"every broken entry is reported", "providers: [{name: a, type: gcp, gcp: {fail: [project is required]}}, {name: b, type: kubernetes, kubernetes: {fail: [namespace is required]}}]",
			[]string{"providers[0] (a): gcp.project is required", "providers[1] (b): kubernetes.namespace is required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml), testTypes)
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

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(good, []byte(docsExample), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(good, testTypes)
	if err != nil || len(cfg.Providers) != 2 {
		t.Fatalf("LoadConfig = %+v, %v", cfg, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("providers: [{name: a, type: gcp, gcp: {fail: [project is required]}}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(bad, testTypes); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "gcp.project is required") {
		t.Fatalf("LoadConfig(bad) error = %v; want the path and the field", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml"), testTypes); err == nil {
		t.Fatal("LoadConfig of a missing file succeeded")
	}
}

func TestProblems(t *testing.T) {
	if err := Problems(nil); err != nil {
		t.Fatalf("Problems(nil) = %v, want nil", err)
	}
	err := Problems([]string{"kvm.ssh.user is required", "kvm.hosts needs at least one host"})
	j, ok := err.(interface{ Unwrap() []error })
	if !ok || len(j.Unwrap()) != 2 || err.Error() != "kvm.hosts needs at least one host\nkvm.ssh.user is required" {
		t.Fatalf("Problems = %q; want two errors, sorted", err)
	}
}
