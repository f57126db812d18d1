package kvm

import (
	"reflect"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfig(t *testing.T) {
	cfg, err := parse(`
providers:
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
      defaults: {zone: beelink, image: debian-12, machineType: small}
      vendorData: "#cloud-config\n"
  - name: quiet
    type: kvm
    kvm:
      ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k, socket: /run/libvirt/sock}
      hosts: [{name: h, address: 'h:22'}]
      domainType: qemu
      cpuMode: qemu64
      installGuestAgent: false
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Entry: "home", User: "proxyfleet", KeyFile: "/etc/proxyfleet/kvm/id_ed25519", KnownHosts: "/etc/proxyfleet/kvm/known_hosts",
		Hosts:        []Host{{Name: "beelink", Address: "beelink.lan:22", Pool: "default", Network: "br0"}},
		Images:       map[string]Image{"debian-12": {URL: "https://cloud.example/debian-12.qcow2", Firmware: FirmwareUEFI}},
		MachineTypes: map[string]MachineType{"small": {VCPUs: 1, MemoryMiB: 1024, DiskGiB: 10}},
		Defaults:     providers.Placement{Zone: "beelink", Image: "debian-12", MachineType: "small"},
		GuestAgent:   true, VendorData: []byte("#cloud-config\n"), Budgets: DefaultBudgets(),
	}
	got.Log = want.Log
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig =\n%+v\nwant\n%+v", got, want)
	}
	quiet, err := ReadConfig(cfg.Providers[1])
	if err != nil || quiet.GuestAgent || quiet.DomainType != DomainQEMU || quiet.CPUMode != "qemu64" || quiet.Socket != "/run/libvirt/sock" || len(quiet.Images) != 0 || quiet.Images == nil {
		t.Fatalf("ReadConfig = %+v, %v; want no guest agent, qemu with the qemu64 CPU, the socket, an empty image map", quiet, err)
	}
	if _, err := ReadConfig(providers.Entry{Name: "gcp-eu", Type: "gcp"}); err == nil {
		t.Fatal("ReadConfig accepted a gcp entry")
	}
}

func TestReadConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // each must appear in the error
	}{
		{"unknown key in a host", "providers: [{name: k, type: kvm, kvm: {hosts: [{name: h, adress: 'h:22'}]}}]",
			[]string{"providers[0] (k): kvm.hosts[0].adress: unknown field"}},
		{"everything missing", "providers: [{name: k, type: kvm, kvm: {}}]", []string{
			"providers[0] (k): kvm.ssh.user is required",
			"providers[0] (k): kvm.ssh.privateKeyFile is required",
			"providers[0] (k): kvm.ssh.knownHostsFile is required",
			"providers[0] (k): kvm.hosts needs at least one host"}},
		{"relative key path", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: id, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}]}}]",
			[]string{`providers[0] (k): kvm.ssh.privateKeyFile "id" must be an absolute path`}},
		{"host problems", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: h}, {name: h, address: 'h:0'}, {address: 'x:22'}]}}]",
			[]string{
				`providers[0] (k): kvm.hosts[0].address "h" is not host:port`,
				`providers[0] (k): kvm.hosts[1].name "h" is used twice`,
				`providers[0] (k): kvm.hosts[1].address "h:0" has no valid port`,
				"providers[0] (k): kvm.hosts[2].name is required"}},
		{"image and machine type problems", `providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}],
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
		{"image URL shown without its password", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}], images: {deb: {url: 'ftp://u:hunter2@x/y'}}}}]",
			[]string{`providers[0] (k): kvm.images[deb].url "ftp://u:xxxxx@x/y" is not an http(s) URL`}},
		{"host names, defaults, domain type and image format problems", `providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k, socket: run/sock},
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
		{"a CPU mode software emulation cannot use", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}], domainType: qemu, cpuMode: host-model}}]",
			[]string{`providers[0] (k): kvm.cpuMode "host-model" needs domainType kvm (software emulation has no host CPU to pass through; name a CPU model such as qemu64, or leave cpuMode out)`}},
		{"a CPU mode that is no model name", "providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: [{name: h, address: 'h:22'}], cpuMode: 'Haswell <x>'}}]",
			[]string{`providers[0] (k): kvm.cpuMode "Haswell <x>" is not host-passthrough, host-model or a libvirt CPU model name (letters, digits, '.', '_', '-')`}},
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

// FuzzReadConfig feeds a providers config file of kvm entries (outside
// input): it never panics, and every entry it accepts makes a provider (New,
// which does not dial, refuses nothing ReadConfig let through).
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte(`providers:
- name: home
  type: kvm
  kvm:
    ssh: {user: proxyfleet, privateKeyFile: /etc/proxyfleet/kvm/id_ed25519, knownHostsFile: /etc/proxyfleet/kvm/known_hosts}
    hosts: [{name: beelink, address: "beelink.lan:22", pool: default, network: br0}]
    images: {debian-12: {url: "https://cloud.example/debian-12.qcow2", sha256: "` + strings.Repeat("0", 64) + `", firmware: uefi, format: raw}}
    machineTypes: {small: {vcpus: 1, memoryMiB: 1024, diskGiB: 10}}
    defaults: {zone: beelink, image: debian-12, machineType: small}
    domainType: qemu
    installGuestAgent: false
`))
	f.Add([]byte("providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k, socket: /s}, hosts: [{name: h, address: 'h:22', bridge: br0}]}}]"))
	f.Add([]byte("providers: [{name: k, type: kvm, kvm: {ssh: {user: u, privateKeyFile: id}, hosts: [{name: h/x, address: h}], images: {Bad_Key: {url: 'ftp://u:p@x'}}}}]"))
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
			p, err := New(got)
			if err != nil {
				t.Fatalf("New refuses an accepted entry in %q: %v", in, err)
			}
			p.Close()
		}
	})
}
