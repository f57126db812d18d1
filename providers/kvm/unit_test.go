package kvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/nocloud"
)

func TestStateMapping(t *testing.T) {
	tests := []struct {
		name  string
		st    libvirt.DomainState
		hasIP bool
		want  providers.State
	}{
		{"running with an address is running", libvirt.DomainRunning, true, providers.StateRunning},
		{"running without an address is provisioning", libvirt.DomainRunning, false, providers.StateProvisioning},
		{"blocked counts as running", libvirt.DomainBlocked, true, providers.StateRunning},
		{"nostate is provisioning, never a replacement", libvirt.DomainNostate, false, providers.StateProvisioning},
		{"shutoff is stopped", libvirt.DomainShutoff, false, providers.StateStopped},
		{"crashed is stopped", libvirt.DomainCrashed, false, providers.StateStopped},
		{"shutting down is stopped", libvirt.DomainShutdown, false, providers.StateStopped},
		{"paused is stopped", libvirt.DomainPaused, false, providers.StateStopped},
		{"suspended is stopped", libvirt.DomainPmsuspended, false, providers.StateStopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stateOf(tt.st, tt.hasIP); got != tt.want {
				t.Fatalf("stateOf(%d, %v) = %s, want %s", tt.st, tt.hasIP, got, tt.want)
			}
		})
	}
}

func ifc(addrs ...string) []libvirt.DomainInterface {
	var out []libvirt.DomainIPAddr
	for _, a := range addrs {
		out = append(out, libvirt.DomainIPAddr{Addr: a})
	}
	return []libvirt.DomainInterface{{Name: "eth0", Addrs: out}}
}

func TestAddressRules(t *testing.T) {
	agentDown := libvirt.Error{Code: uint32(libvirt.ErrAgentUnresponsive), Message: "QEMU guest agent is not connected"}
	arpBroken := libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: "wrong nlmsg len"}
	connLost := errors.New("connection is closed")
	tests := []struct {
		name    string
		results []sourceResult
		wantIP  string
		wantErr error
	}{
		{"the first routable IPv4 wins, loopback and link-local skipped",
			[]sourceResult{{name: "agent", ifaces: ifc("127.0.0.1", "169.254.3.4", "fe80::1", "192.168.1.20", "10.0.0.9")}}, "192.168.1.20", nil},
		{"an agent that is not up yet and an empty lease table is no address yet",
			[]sourceResult{{name: "agent", err: agentDown}, {name: "lease"}, {name: "arp", err: arpBroken}}, "", nil},
		{"a later source's address is used when the agent fails",
			[]sourceResult{{name: "agent", err: agentDown}, {name: "lease", ifaces: ifc("192.168.122.7")}}, "192.168.122.7", nil},
		{"every source failing is transient",
			[]sourceResult{{name: "agent", err: agentDown}, {name: "lease", err: arpBroken}, {name: "arp", err: arpBroken}}, "", providers.ErrTransient},
		{"a dead connection under the read is transient, not an empty address",
			[]sourceResult{{name: "agent", err: agentDown}, {name: "lease", err: connLost}}, "", providers.ErrTransient},
		{"only unroutable addresses is no address yet",
			[]sourceResult{{name: "agent", ifaces: ifc("0.0.0.0", "224.0.0.1", "::1")}, {name: "lease"}, {name: "arp"}}, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, err := decideAddress("d", tt.results)
			if ip != tt.wantIP || providers.Class(err) != tt.wantErr {
				t.Fatalf("decideAddress = %q, %v; want %q, class %v", ip, err, tt.wantIP, tt.wantErr)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	lverr := func(c libvirt.ErrorNumber) error { return libvirt.Error{Code: uint32(c), Message: "m"} }
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"no domain is not found", lverr(libvirt.ErrNoDomain), providers.ErrNotFound},
		{"no volume is not found", lverr(libvirt.ErrNoStorageVol), providers.ErrNotFound},
		{"bad XML is permanent", lverr(libvirt.ErrXMLDetail), providers.ErrPermanent},
		{"an unsupported config is permanent", lverr(libvirt.ErrConfigUnsupported), providers.ErrPermanent},
		{"access denied is permanent", lverr(libvirt.ErrAccessDenied), providers.ErrPermanent},
		{"a missing pool is permanent", lverr(libvirt.ErrNoStoragePool), providers.ErrPermanent},
		{"an internal error is transient", lverr(libvirt.ErrInternalError), providers.ErrTransient},
		{"an operation failure is transient", lverr(libvirt.ErrOperationFailed), providers.ErrTransient},
		{"a transport error is transient", errors.New("EOF"), providers.ErrTransient},
		{"an existing verdict is kept", fmt.Errorf("%w: x", providers.ErrQuotaExceeded), providers.ErrQuotaExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classify("op", tt.err)
			if providers.Class(got) != tt.want {
				t.Fatalf("classify(%v) class = %v, want %v", tt.err, providers.Class(got), tt.want)
			}
			if _, ok := libvirtCode(tt.err); ok {
				if _, still := libvirtCode(got); !still {
					t.Fatal("the libvirt code is lost after classification")
				}
			}
		})
	}
}

func TestClassifySSH(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"a host key mismatch is permanent", &knownhosts.KeyError{Want: []knownhosts.KnownKey{{}}}, providers.ErrPermanent},
		{"an unknown host key is permanent", &knownhosts.KeyError{}, providers.ErrPermanent},
		{"an auth refusal is permanent", errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey]"), providers.ErrPermanent},
		{"a missing file is transient", fmt.Errorf("reading: %w", errFileMissing()), providers.ErrTransient},
		{"a refused TCP connection is transient", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), providers.ErrTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := providers.Class(classifySSH(stageHandshake, tt.err)); got != tt.want {
				t.Fatalf("class = %v, want %v", got, tt.want)
			}
		})
	}
}

func errFileMissing() error {
	_, err := statFile("/nonexistent/proxyfleet/key")
	return err
}

func TestDomainXML(t *testing.T) {
	spec := domainSpec{Name: "proxy-abc", DomainType: "qemu", VCPUs: 2, MemoryMiB: 512, DiskPath: "/pool/proxy-abc.qcow2",
		SeedPath: "/pool/proxy-abc-seed.iso", Firmware: FirmwareUEFI, Network: "default",
		Mark: Mark{Managed: true, UID: "u-1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Proxy: "ns/px"}}
	tests := []struct {
		name    string
		edit    func(*domainSpec)
		want    []string
		notWant []string
		err     bool
	}{
		{"uefi by default with secure boot off, file disks at the reported paths, our mark", func(*domainSpec) {},
			[]string{`<domain type="qemu">`, `<os firmware="efi">`, `<feature enabled="no" name="secure-boot"/>`, "<acpi/>",
				`<source file="/pool/proxy-abc.qcow2"/>`, `<source file="/pool/proxy-abc-seed.iso"/>`, `<controller type="scsi" index="0" model="virtio-scsi"/>`, `<target dev="sda" bus="scsi"/>`, `<source network="default"/>`,
				`xmlns:proxyfleet="` + MetadataNS + `"`, `uid="u-1"`, `createdAt="2026-01-02T03:04:05Z"`, `org.qemu.guest_agent.0`,
				`<memory unit="MiB">512</memory>`, `<vcpu>2</vcpu>`},
			[]string{`type="volume"`, "<pool", "host-passthrough", `bus="sata"`}, false},
		{"bios images get no firmware selection", func(s *domainSpec) { s.Firmware = FirmwareBIOS }, []string{"<os>"}, []string{"firmware="}, false},
		{"a bridge instead of a network", func(s *domainSpec) { s.Network, s.Bridge = "", "br0" }, []string{`<interface type="bridge">`, `<source bridge="br0"/>`}, nil, false},
		{"kvm passes the host CPU through", func(s *domainSpec) { s.DomainType = "kvm" }, []string{`<domain type="kvm">`, "host-passthrough"}, nil, false},
		{"kvm with cpuMode host-model", func(s *domainSpec) { s.DomainType, s.CPUMode = "kvm", CPUHostModel }, []string{`<cpu mode="host-model"/>`}, []string{"host-passthrough"}, false},
		{"a named CPU model is exact, under kvm", func(s *domainSpec) { s.DomainType, s.CPUMode = "kvm", "EPYC-Rome" },
			[]string{`<cpu mode="custom" match="exact"><model fallback="forbid">EPYC-Rome</model></cpu>`}, []string{"host-passthrough"}, false},
		{"and under qemu", func(s *domainSpec) { s.CPUMode = "qemu64" }, []string{`<model fallback="forbid">qemu64</model>`}, nil, false},
		{"paths are escaped", func(s *domainSpec) { s.DiskPath = `/p/a"b<c` }, []string{`/p/a&#34;b&lt;c`}, nil, false},
		{"no disk path is refused", func(s *domainSpec) { s.DiskPath = "" }, nil, nil, true},
		{"both network and bridge are refused", func(s *domainSpec) { s.Bridge = "br0" }, nil, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec
			tt.edit(&s)
			x, err := domainXML(s)
			if tt.err {
				if providers.Class(err) != providers.ErrPermanent {
					t.Fatalf("err = %v, want Permanent", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(x, w) {
					t.Errorf("XML lacks %s:\n%s", w, x)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(x, w) {
					t.Errorf("XML has %s:\n%s", w, x)
				}
			}
		})
	}
}

func TestMarkRoundTripAndTheBareFormLibvirtReturns(t *testing.T) {
	m := Mark{Managed: true, UID: "u-<1>", CreatedAt: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), Proxy: "ns/px", Installation: "cluster-a"}
	for name, raw := range map[string]string{
		"as written":                         renderMark(m),
		"without the namespace (libvirt 11)": `<instance managed="true" uid="u-&lt;1&gt;" createdAt="2026-05-06T07:08:09Z" proxy="ns/px" installation="cluster-a"/>`,
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseMark(raw)
			if err != nil || got != m {
				t.Fatalf("parseMark(%s) = %+v, %v; want %+v", raw, got, err, m)
			}
		})
	}
	if _, err := parseMark("not xml <"); err == nil {
		t.Fatal("garbage metadata parsed")
	}
}

func TestMarkVolumeNamesRoundTripWithAndWithoutAnInstallation(t *testing.T) {
	at := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		guest string
		mark  Mark
		vol   string
	}{
		{"tagged with its installation", "proxy-abc", Mark{Managed: true, UID: "uid-1", CreatedAt: at, Installation: "cluster-a"},
			"proxy-abc.uid-1.1778051289.i-cluster-a.mark"},
		{"made before installations were tagged", "proxy-abc", Mark{Managed: true, UID: "uid-1", CreatedAt: at},
			"proxy-abc.uid-1.1778051289.mark"},
		{"a guest name with dots, untagged", "a.b", Mark{Managed: true, UID: "uid-1", CreatedAt: at}, "a.b.uid-1.1778051289.mark"},
		{"a guest name with dots, tagged", "a.b", Mark{Managed: true, UID: "uid-1", CreatedAt: at, Installation: "c"}, "a.b.uid-1.1778051289.i-c.mark"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := markVolumeName(tc.guest, tc.mark); got != tc.vol {
				t.Fatalf("markVolumeName = %q, want %q", got, tc.vol)
			}
			guest, m, ok := parseMarkVolume(tc.vol)
			if !ok || guest != tc.guest || m != tc.mark {
				t.Fatalf("parseMarkVolume(%q) = %q %+v %v, want %q %+v", tc.vol, guest, m, ok, tc.guest, tc.mark)
			}
		})
	}
	for _, bad := range []string{"proxy-abc.uid-1.1778051289.i-.mark", "proxy-abc.uid-1.1778051289.i-a_b.mark", "proxy-abc.uid-1.i-a.mark"} {
		if _, _, ok := parseMarkVolume(bad); ok {
			t.Errorf("parseMarkVolume(%q) read a mark", bad)
		}
	}
}

func TestProviderIDs(t *testing.T) {
	tests := []struct {
		id         string
		host, name string
		ok         bool
	}{
		{"hosts/hv-1/domains/proxy-abc", "hv-1", "proxy-abc", true},
		{"hosts/hv/1/domains/proxy-abc", "", "", false},
		{"hosts/HV/domains/proxy-abc", "", "", false},
		{"zones/a/instances/b", "", "", false},
		{"hosts/hv/domains/", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			h, n, err := parseProviderID(tt.id)
			if tt.ok != (err == nil) || h != tt.host || n != tt.name {
				t.Fatalf("parseProviderID = %q, %q, %v", h, n, err)
			}
			if err != nil && providers.Class(err) != providers.ErrPermanent {
				t.Fatalf("a bad providerID must be Permanent, got %v", err)
			}
			if tt.ok && FormatProviderID(h, n) != tt.id {
				t.Fatal("format does not round-trip")
			}
		})
	}
}

func TestVolumeNamesCarryTheEntry(t *testing.T) {
	if a, b := baseVolumeName("kvm-a", "debian-13", "qcow2"), baseVolumeName("kvm-b", "debian-13", "qcow2"); a == b {
		t.Fatalf("two entries share base volume %s", a)
	}
	if got := baseVolumeName("kvm-a", "debian-13", "qcow2"); got != "base-kvm-a-debian-13.qcow2" || markerVolumeName(got, "ab") != got+".sha256-ab" {
		t.Fatalf("base %s / marker %s", got, markerVolumeName(got, "ab"))
	}
}

func testConfig() Config {
	return Config{Entry: "kvm-a", User: "u", KeyFile: "/k", KnownHosts: "/kh",
		Hosts:        []Host{{Name: "hv-1", Address: "127.0.0.1:22"}, {Name: "hv-2", Address: "127.0.0.2:22", Bridge: "br0"}},
		Images:       map[string]Image{"deb": {URL: "http://127.0.0.1/x.qcow2"}},
		MachineTypes: map[string]MachineType{"small": {VCPUs: 1, MemoryMiB: 512, DiskGiB: 4}},
		Defaults:     providers.Placement{Image: "deb", MachineType: "small"}}
}

func TestNewAppliesDefaultsAndRefusesUnaddressableNames(t *testing.T) {
	p, err := New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if h := p.hosts["hv-1"]; h.Pool != "default" || h.Network != "default" || p.hosts["hv-2"].Network != "" {
		t.Fatalf("host defaults: %+v %+v", h, p.hosts["hv-2"])
	}
	if b := p.cfg.Budgets; b != DefaultBudgets() {
		t.Fatalf("budgets = %+v, want the defaults for every zero field", b)
	}
	if img := p.cfg.Images["deb"]; img.Format != "qcow2" || img.Firmware != FirmwareUEFI || p.cfg.DomainType != "kvm" || p.cfg.Socket != DefaultSocket {
		t.Fatalf("defaults not applied: %+v %s %s", img, p.cfg.DomainType, p.cfg.Socket)
	}
	for name, edit := range map[string]func(*Config){
		"a host name with a slash":   func(c *Config) { c.Hosts[0].Name = "hv/1" },
		"an image key with a dot":    func(c *Config) { c.Images = map[string]Image{"a.b": {URL: "http://x"}} },
		"an entry name with a slash": func(c *Config) { c.Entry = "a/b" },
		"no hosts":                   func(c *Config) { c.Hosts = nil },
	} {
		t.Run(name, func(t *testing.T) {
			c := testConfig()
			edit(&c)
			if _, err := New(c); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestPlacementIsResolvedBeforeAnyDial(t *testing.T) {
	p, err := New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		pl   providers.Placement
		ok   bool
	}{
		{"a configured host with the defaults", providers.Placement{Zone: "hv-2"}, true},
		{"two hosts and no zone", providers.Placement{}, false},
		{"an unknown host", providers.Placement{Zone: "hv-9"}, false},
		{"an unknown image", providers.Placement{Zone: "hv-1", Image: "arch"}, false},
		{"an unknown machine type", providers.Placement{Zone: "hv-1", MachineType: "xl"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.resolve(tt.pl)
			if tt.ok != (err == nil) || (err != nil && providers.Class(err) != providers.ErrPermanent) {
				t.Fatalf("resolve(%+v) = %v", tt.pl, err)
			}
		})
	}
}

func TestSeedContents(t *testing.T) {
	own := []byte("#cloud-config\n# mine\nversion: 1.10\n")
	tests := []struct {
		name       string
		guestAgent bool
		vendor     []byte
		req        providers.CreateRequest
		userData   func([]byte) bool
		vendorData func([]byte) bool
		err        error
	}{
		{"the Proxy's own cloud-init reaches the seed byte for byte", true, nil,
			providers.CreateRequest{Name: "proxy-a", CloudInit: own},
			func(b []byte) bool { return bytes.Equal(b, own) },
			func(b []byte) bool { return string(b) == nocloud.GuestAgentScript }, nil},
		{"without cloud-init the bootstrap runs Squid with the hashed login", false, nil,
			providers.CreateRequest{Name: "proxy-b", Port: 3128, ProxyAuth: &providers.BasicAuth{Username: "pf", Password: "pw-very-secret"}},
			func(b []byte) bool {
				return bytes.Contains(b, []byte("squid")) && bytes.Contains(b, []byte("pf:$2")) && !bytes.Contains(b, []byte("pw-very-secret"))
			},
			func(b []byte) bool { return b == nil }, nil},
		{"without cloud-init and without a login it refuses (never an open proxy)", true, nil,
			providers.CreateRequest{Name: "proxy-c"}, nil, nil, providers.ErrPermanent},
		{"configured vendor-data travels beside the agent script", true, []byte("#cloud-config\nntp: {}\n"),
			providers.CreateRequest{Name: "proxy-d", CloudInit: own}, nil,
			func(b []byte) bool {
				return bytes.Contains(b, []byte("multipart/mixed")) && bytes.Contains(b, []byte("ntp: {}"))
			}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			c.GuestAgent, c.VendorData = tt.guestAgent, tt.vendor
			p, err := New(c)
			if err != nil {
				t.Fatal(err)
			}
			iso, err := p.seedFor(tt.req)
			if tt.err != nil {
				if providers.Class(err) != tt.err {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, files, err := nocloud.ReadISO(iso)
			if err != nil {
				t.Fatal(err)
			}
			if tt.userData != nil && !tt.userData(files["user-data"]) {
				t.Fatalf("user-data:\n%s", files["user-data"])
			}
			if tt.vendorData != nil && !tt.vendorData(files["vendor-data"]) {
				t.Fatalf("vendor-data:\n%s", files["vendor-data"])
			}
		})
	}
}

type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("connection reset by mirror")
	}
	f.n--
	p[0] = 'x'
	return 1, nil
}

func TestEOFReaderTurnsASourceErrorIntoEOFAndKeepsIt(t *testing.T) {
	r := &eofReader{r: &failingReader{n: 3}}
	b, err := io.ReadAll(r)
	if err != nil || string(b) != "xxx" {
		t.Fatalf("ReadAll = %q, %v; want the bytes read and a clean EOF", b, err)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "reset") {
		t.Fatalf("kept error = %v, want the source's", r.err)
	}
	clean := &eofReader{r: strings.NewReader("ok")}
	if b, _ := io.ReadAll(clean); string(b) != "ok" || clean.err != nil {
		t.Fatalf("a clean source reported %v", clean.err)
	}
}

// TestAnImageAnotherCreateHoldsIsATransientErrorNotAWait pins that a
// Create needing a base image another Create is preparing (downloading, for
// up to the ImageTransfer budget) returns at once with a transient error:
// waiting held the reconcile worker, and with a few Proxies on a new image
// every worker, so no other Proxy was reconciled until the download ended.
func TestAnImageAnotherCreateHoldsIsATransientErrorNotAWait(t *testing.T) {
	p := &Provider{cfg: Config{Entry: "kvm-eu"}}
	pl := placement{host: &Host{Name: "hv-1"}, imageKey: "debian", image: Image{Format: "qcow2"}}
	unlock, ok := p.images.TryLock("hv-1/" + baseVolumeName("kvm-eu", "debian", "qcow2"))
	if !ok {
		t.Fatal("lock taken")
	}
	defer unlock()
	done := make(chan error, 1)
	go func() {
		_, err := p.ensureImage(context.Background(), pl, libvirt.StoragePool{}, 0)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, providers.ErrTransient) || !strings.Contains(err.Error(), "being prepared (downloaded) by another Create") {
			t.Fatalf("ensureImage = %v, want a transient error saying another Create holds the image", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ensureImage waited for the image another Create holds")
	}
}
