package providers

import (
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

func TestParseConfigIssueExample(t *testing.T) {
	cfg, err := ParseConfig([]byte(docsExample))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := Config{Providers: []Entry{
		{Name: "in-cluster", Type: TypeKubernetes, Kubernetes: &KubernetesConfig{Namespace: "proxyfleet-egress", Image: "ubuntu/squid:6.6-24.04_beta"}},
		{Name: "gcp-eu", Type: TypeGCP, GCP: &GCPConfig{Project: "my-project", Defaults: GCPDefaults{
			Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"}}},
	}}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
}

func TestParseConfigFullBlocks(t *testing.T) {
	const full = `
providers:
  - name: pods
    type: kubernetes
    kubernetes:
      namespace: egress
      clusterCIDRs: [203.0.113.0/24, "2001:db8:1::/48"]
      clientCIDRs: [10.0.0.0/8]
  - name: home
    type: kvm
    kvm:
      ssh: {user: proxyfleet, privateKeyFile: /etc/proxyfleet/kvm/id_ed25519, knownHostsFile: /etc/proxyfleet/kvm/known_hosts}
      hosts:
        - {name: beelink, address: "beelink.lan:22", pool: default, network: br0}
      images:
        debian-12: {url: "https://cloud.example/debian-12.qcow2", firmware: uefi}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 1024, diskGiB: 10}
`
	cfg, err := ParseConfig([]byte(full))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if got := cfg.Providers[0].Kubernetes.ClusterCIDRs; len(got) != 2 || got[1] != "2001:db8:1::/48" {
		t.Fatalf("clusterCIDRs = %v", got)
	}
	if got := cfg.Providers[1].KVM.MachineTypes["small"]; got != (KVMMachineType{VCPUs: 1, MemoryMiB: 1024, DiskGiB: 10}) {
		t.Fatalf("machineTypes[small] = %+v", got)
	}
}

func TestParseConfigEmptyIsNoProviders(t *testing.T) {
	for _, in := range []string{"", "providers: []", "providers:"} {
		cfg, err := ParseConfig([]byte(in))
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
		{"block of another type", "providers: [{name: a, type: kubernetes, " + k8s + ", gcp: {project: my-project}}]",
			[]string{`providers[0] (a): gcp block is not allowed for type "kubernetes"`}},
		{"unknown key in entry", "providers: [{name: a, type: kubernetes, " + k8s + ", zone: x}]", []string{"providers[0] (a): zone: unknown field"}},
		{"unknown key in a block", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: egress, imagee: x}}]",
			[]string{"providers[0] (a): kubernetes.imagee: unknown field"}},
		{"unknown key nested deep", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zonee: x}}}]",
			[]string{"providers[0] (g): gcp.defaults.zonee: unknown field"}},
		{"wrong value type", "providers: [{name: g, type: gcp, gcp: {project: [a]}}]", []string{"providers[0] (g): gcp.project: want a string, got array"}},
		{"duplicate key", "providers: [{name: a, name: b}]", []string{"already set"}},
		{"kubernetes namespace required", "providers: [{name: a, type: kubernetes, kubernetes: {image: x}}]", []string{"providers[0] (a): kubernetes.namespace is required"}},
		{"kubernetes namespace invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: Egress}}]",
			[]string{`providers[0] (a): kubernetes.namespace "Egress" is not a DNS-1123 label`}},
		{"kubernetes image invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, image: 'ubuntu/squid latest'}}]",
			[]string{`providers[0] (a): kubernetes.image "ubuntu/squid latest" is not an image reference`}},
		{"kubernetes CIDR invalid", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, clusterCIDRs: [10.0.0.0/33]}}]",
			[]string{`providers[0] (a): kubernetes.clusterCIDRs[0] "10.0.0.0/33" is not a CIDR`}},
		{"kubernetes CIDR with host bits", "providers: [{name: a, type: kubernetes, kubernetes: {namespace: e, clientCIDRs: [10.1.2.3/8]}}]",
			[]string{`providers[0] (a): kubernetes.clientCIDRs[0] "10.1.2.3/8" has host bits set (did you mean 10.0.0.0/8?)`}},
		{"gcp project required", "providers: [{name: gcp-eu, type: gcp, gcp: {defaults: {zone: europe-west1-b}}}]", []string{"providers[0] (gcp-eu): gcp.project is required"}},
		{"gcp project invalid", "providers: [{name: g, type: gcp, gcp: {project: My_Project}}]", []string{`providers[0] (g): gcp.project "My_Project" is not a project ID`}},
		{"gcp zone invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {zone: europe}}}]", []string{`providers[0] (g): gcp.defaults.zone "europe" is not a zone`}},
		{"gcp address type unknown", "providers: [{name: g, type: gcp, gcp: {project: my-project, addressType: public}}]",
			[]string{`providers[0] (g): gcp.addressType "public" is not external or internal`}},
		{"gcp network tag invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, networkTags: [Squid_Port]}}]",
			[]string{`providers[0] (g): gcp.networkTags[0] "Squid_Port" is not a network tag`}},
		{"gcp label key invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, labels: {Team: x}}}]",
			[]string{"providers[0] (g): gcp.labels[Team]: the key is not a GCP label key"}},
		{"gcp label value invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, labels: {team: Web.Crawl}}}]",
			[]string{`providers[0] (g): gcp.labels[team]: the value "Web.Crawl" is not a GCP label value`}},
		{"gcp credentials file relative", "providers: [{name: g, type: gcp, gcp: {project: my-project, credentialsFile: key.json}}]",
			[]string{`providers[0] (g): gcp.credentialsFile "key.json" must be an absolute path`}},
		{"gcp endpoint not a URL", "providers: [{name: g, type: gcp, gcp: {project: my-project, endpoint: compute.example}}]",
			[]string{"providers[0] (g): gcp.endpoint is not an http(s) base URL"}},
		{"gcp noAuth with a credentials file", "providers: [{name: g, type: gcp, gcp: {project: my-project, noAuth: true, credentialsFile: /k.json}}]",
			[]string{"providers[0] (g): gcp.noAuth and gcp.credentialsFile are mutually exclusive"}},
		{"gcp service account not an e-mail", "providers: [{name: g, type: gcp, gcp: {project: my-project, serviceAccount: squid}}]",
			[]string{`providers[0] (g): gcp.serviceAccount "squid" is not a service account e-mail`}},
		{"gcp machine type invalid", "providers: [{name: g, type: gcp, gcp: {project: my-project, defaults: {machineType: E2 Micro}}}]",
			[]string{`providers[0] (g): gcp.defaults.machineType "E2 Micro" is not a machine type`}},
		{"kvm everything missing", "providers: [{name: k, type: kvm, kvm: {}}]", []string{
			"providers[0] (k): kvm.ssh.user is required",
			"providers[0] (k): kvm.ssh.privateKeyFile is required",
			"providers[0] (k): kvm.ssh.knownHostsFile is required",
			"providers[0] (k): kvm.hosts needs at least one host"}},
		{"kvm relative key path", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: id, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}]}}]",
			[]string{`providers[0] (k): kvm.ssh.privateKeyFile "id" must be an absolute path`}},
		{"kvm host problems", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: h}, {name: h, address: 'h:0'}, {address: 'x:22'}]}}]",
			[]string{
				`providers[0] (k): kvm.hosts[0].address "h" is not host:port`,
				`providers[0] (k): kvm.hosts[1].name "h" is used twice`,
				`providers[0] (k): kvm.hosts[1].address "h:0" has no valid port`,
				"providers[0] (k): kvm.hosts[2].name is required"}},
		{"kvm image and machine type problems", `providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}],
  images: {deb: {url: 'ftp://x/y', sha256: abc, firmware: coreboot}, Bad_Key: {url: 'https://x/y'}},
  machineTypes: {tiny: {vcpus: 0, memoryMiB: 64, diskGiB: 0}}}}]`,
			[]string{
				`providers[0] (k): kvm.images[deb].url "ftp://x/y" is not an http(s) URL`,
				"providers[0] (k): kvm.images[deb].sha256 is not 64 lower-case hex digits",
				`providers[0] (k): kvm.images[deb].firmware "coreboot" is not uefi or bios`,
				"providers[0] (k): kvm.images[Bad_Key]: the key is not a DNS-1123 label",
				"providers[0] (k): kvm.machineTypes[tiny].vcpus must be at least 1",
				"providers[0] (k): kvm.machineTypes[tiny].memoryMiB must be at least 128",
				"providers[0] (k): kvm.machineTypes[tiny].diskGiB must be at least 1"}},
		{"kvm image URL shown without its password", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}], images: {deb: {url: 'ftp://u:hunter2@x/y'}}}}]",
			[]string{`providers[0] (k): kvm.images[deb].url "ftp://u:xxxxx@x/y" is not an http(s) URL`}},
		{"kvm host names, defaults, domain type and image format problems", `providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k, socket: run/sock},
  hosts: [{name: h/x, address: 'h:22', network: lan, bridge: br0}, {name: g, address: 'g:22', pool: 'a pool'}],
  images: {deb: {url: 'https://x/y', format: vmdk}}, domainType: xen, defaults: {zone: nope, image: other, machineType: huge}}}]`,
			[]string{
				`providers[0] (k): kvm.hosts[0].name "h/x" is not a DNS-1123 label`,
				"providers[0] (k): kvm.hosts[0]: network and bridge are mutually exclusive",
				`providers[0] (k): kvm.hosts[1].pool "a pool" is not a plain libvirt name (letters, digits, '.', '_', '-')`,
				`providers[0] (k): kvm.images[deb].format "vmdk" is not qcow2 or raw`,
				`providers[0] (k): kvm.domainType "xen" is not kvm or qemu`,
				`providers[0] (k): kvm.defaults.zone "nope" is not a configured host`,
				`providers[0] (k): kvm.defaults.image "other" is not a kvm.images key`,
				`providers[0] (k): kvm.defaults.machineType "huge" is not a kvm.machineTypes key`,
				`providers[0] (k): kvm.ssh.socket "run/sock" must be an absolute path`}},
		{"every broken entry is reported", "providers: [{name: a, type: gcp, gcp: {}}, {name: b, type: kubernetes, kubernetes: {}}]",
			[]string{"providers[0] (a): gcp.project is required", "providers[1] (b): kubernetes.namespace is required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml))
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
	cfg, err := LoadConfig(good)
	if err != nil || len(cfg.Providers) != 2 {
		t.Fatalf("LoadConfig = %+v, %v", cfg, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("providers: [{name: a, type: gcp, gcp: {}}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "gcp.project is required") {
		t.Fatalf("LoadConfig(bad) error = %v; want the path and the field", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("LoadConfig of a missing file succeeded")
	}
}
