package kvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testkit/sshd"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
	"github.com/proxyfleet/proxyfleet/providers/nocloud"
)

// imageServer serves the test's base image, and a copy that breaks off half
// way (the Content-Length promised, half the bytes sent, the connection cut).
type imageServer struct {
	*httptest.Server
	image  []byte
	digest string
	mu     sync.Mutex
	gets   map[string]int
}

func startImageServer(t *testing.T, image []byte) *imageServer {
	sum := sha256.Sum256(image)
	s := &imageServer{image: image, digest: hex.EncodeToString(sum[:]), gets: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		switch r.URL.Path {
		case "/tiny.qcow2":
			w.Header().Set("Content-Length", strconv.Itoa(len(image)))
			_, _ = w.Write(image)
		case "/poweroff.img":
			img := powerOffDisk()
			w.Header().Set("Content-Length", strconv.Itoa(len(img)))
			_, _ = w.Write(img)
		case "/broken.qcow2":
			w.Header().Set("Content-Length", strconv.Itoa(len(image)))
			_, _ = w.Write(image[:len(image)/2])
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// powerOffDisk is a 1 MiB raw disk whose boot sector powers the machine
// off at once: SeaBIOS boots it, and it writes SLP_EN to QEMU's ACPI PM1a
// control port (0x604 on q35), so the guest dies right after its start.
func powerOffDisk() []byte {
	disk := make([]byte, 1<<20)
	copy(disk, []byte{
		0xBA, 0x04, 0x06, // mov dx, 0x604
		0xB8, 0x00, 0x20, // mov ax, 0x2000 (SLP_EN, S5)
		0xEF,       // out dx, ax
		0xF4,       // hlt
		0xEB, 0xFD, // jmp $-3 (back to hlt)
	})
	disk[510], disk[511] = 0x55, 0xAA
	return disk
}

func (s *imageServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[path]
}

// fixture is the real libvirtd reached over the real sshd.
type fixture struct {
	lv     *libvirtd.Daemon
	sshd   *sshd.Server
	images *imageServer
}

func (f *fixture) config() Config {
	return Config{
		Entry: "kvm-test", User: f.sshd.User, KeyFile: f.sshd.KeyFile, KnownHosts: f.sshd.KnownHostsFile, Socket: f.lv.Socket,
		Hosts: []Host{{Name: "local", Address: f.sshd.Addr, Pool: f.lv.PoolName, Network: f.lv.Network}},
		Images: map[string]Image{
			"tiny":     {URL: f.images.URL + "/tiny.qcow2", SHA256: f.images.digest},
			"broken":   {URL: f.images.URL + "/broken.qcow2"},
			"wrongsum": {URL: f.images.URL + "/tiny.qcow2", SHA256: strings.Repeat("0", 64)},
			"missing":  {URL: f.images.URL + "/nope.qcow2"},
			"poweroff": {URL: f.images.URL + "/poweroff.img", Format: "raw", Firmware: FirmwareBIOS},
		},
		// "toomany" asks for more vCPUs than QEMU's q35 takes: libvirt
		// refuses it at define, after the guest's volumes exist.
		MachineTypes: map[string]MachineType{"small": {VCPUs: 1, MemoryMiB: 256, DiskGiB: 1}, "huge": {VCPUs: 1, MemoryMiB: 256, DiskGiB: 1 << 20},
			"toomany": {VCPUs: 9999, MemoryMiB: 256, DiskGiB: 1}},
		Defaults:   providers.Placement{Zone: "local", Image: "tiny", MachineType: "small"},
		DomainType: f.lv.DomainType, GuestAgent: true,
		Budgets: Budgets{Dial: 10 * time.Second, RPC: 30 * time.Second, DomainCreate: 90 * time.Second, SeedUpload: 60 * time.Second, ImageTransfer: 2 * time.Minute},
	}
}

func newProvider(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func startFixture(t *testing.T) *fixture {
	lv := libvirtd.Start(t)
	sd := sshd.Start(t)
	img := libvirtd.QemuImgCreate(t, filepath.Join(t.TempDir(), "tiny.qcow2"), "64M")
	return &fixture{lv: lv, sshd: sd, images: startImageServer(t, img)}
}

func request(name, uid string) providers.CreateRequest {
	return providers.CreateRequest{Name: name, OwnerUID: uid, OwnerName: "px", OwnerNamespace: "ns", Port: 3128,
		ProxyAuth: &providers.BasicAuth{Username: "proxyfleet", Password: "s3cret-" + uid}}
}

func wantClass(t *testing.T, err, class error) {
	t.Helper()
	if got := providers.Class(err); got != class {
		t.Fatalf("error class = %v, want %v (err: %v)", got, class, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// TestLifecycleAgainstRealLibvirtOverSSH drives the provider against a real
// libvirtd reached through a real sshd, end to end, in order: each step
// depends on the state the previous one left on the host.
func TestLifecycleAgainstRealLibvirtOverSSH(t *testing.T) {
	f := startFixture(t)
	p := newProvider(t, f.config())
	lv := f.lv.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	const name, uid = "proxy-lifecycle0000a", "uid-lifecycle"
	id := FormatProviderID("local", name)

	t.Run("create fetches the image, builds overlay and seed, defines and starts the domain", func(t *testing.T) {
		inst, err := p.Create(ctx(t), request(name, uid))
		if err != nil {
			t.Fatalf("Create: %v\nguest log:\n%s", err, f.lv.GuestLog(name))
		}
		if inst.ProviderID != id || inst.State != providers.StateProvisioning || inst.OwnerUID != uid {
			t.Fatalf("instance = %+v", inst)
		}
		if n := f.images.count("/tiny.qcow2"); n != 1 {
			t.Fatalf("image downloaded %d times, want 1", n)
		}
		base := filepath.Join(f.lv.PoolDir, "base-kvm-test-tiny.qcow2")
		if got, err := os.ReadFile(base); err != nil || !bytes.Equal(got, f.images.image) {
			t.Fatalf("base image in the pool differs from the served one (err %v)", err)
		}
		if m, err := os.Stat(base + ".sha256-" + f.images.digest); err != nil || m.Size() != 0 {
			t.Fatalf("no empty marker named by the image's sha256 (err %v); pool: %v", err, f.lv.PoolFiles(t))
		}
		dom, err := lv.DomainLookupByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if st, _, _ := lv.DomainGetState(dom, 0); libvirt.DomainState(st) != libvirt.DomainRunning {
			t.Fatalf("domain state %d, want running\n%s", st, f.lv.GuestLog(name))
		}
		xml, err := lv.DomainGetXMLDesc(dom, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"<source file='" + filepath.Join(f.lv.PoolDir, name+".qcow2") + "'",
			"<source file='" + filepath.Join(f.lv.PoolDir, name+"-seed.iso") + "'",
			"<domain type='" + f.lv.DomainType + "'",
			"uid=\"" + uid + "\"", "managed=\"true\"",
			"<source network='" + f.lv.Network + "'",
		} {
			if !strings.Contains(xml, want) {
				t.Fatalf("live domain XML lacks %q:\n%s", want, xml)
			}
		}
		if strings.Contains(xml, "type='volume'") {
			t.Fatalf("disks must be type=file (AppArmor grants only paths):\n%s", xml)
		}
		// The overlay is backed by the cached base.
		ov, err := lv.StorageVolGetXMLDesc(mustVol(t, lv, f.lv.PoolName, name+".qcow2"), 0)
		if err != nil || !strings.Contains(ov, "<path>"+base+"</path>") {
			t.Fatalf("overlay is not backed by %s (err %v):\n%s", base, err, ov)
		}
		// The seed, parsed back: the shared bootstrap with the login, the
		// guest-agent script as vendor-data, never the password in clear.
		iso, err := os.ReadFile(filepath.Join(f.lv.PoolDir, name+"-seed.iso"))
		if err != nil {
			t.Fatal(err)
		}
		label, files, err := nocloud.ReadISO(iso)
		if err != nil || label != nocloud.Label {
			t.Fatalf("seed label %q (err %v)", label, err)
		}
		ud := string(files["user-data"])
		if !strings.HasPrefix(ud, "#cloud-config\n") || !strings.Contains(ud, bootstrap.PasswordFilePath) || !strings.Contains(ud, "proxyfleet:$2") || strings.Contains(ud, "s3cret-") {
			t.Fatalf("user-data is not the bootstrap with a hashed login:\n%s", ud)
		}
		if string(files["vendor-data"]) != nocloud.GuestAgentScript {
			t.Fatalf("vendor-data = %q, want the guest-agent script", files["vendor-data"])
		}
		if !strings.Contains(string(files["meta-data"]), "instance-id: "+name) {
			t.Fatalf("meta-data = %q", files["meta-data"])
		}
	})

	t.Run("create again is idempotent: same domain, no second download", func(t *testing.T) {
		before, _ := lv.DomainLookupByName(name)
		inst, err := p.Create(ctx(t), request(name, uid))
		if err != nil || inst.ProviderID != id {
			t.Fatalf("re-Create = %+v, %v", inst, err)
		}
		after, _ := lv.DomainLookupByName(name)
		if before.UUID != after.UUID || f.images.count("/tiny.qcow2") != 1 {
			t.Fatalf("re-Create made a new domain or fetched again (downloads %d)", f.images.count("/tiny.qcow2"))
		}
	})

	t.Run("create with another uid on the same name is permanent", func(t *testing.T) {
		_, err := p.Create(ctx(t), request(name, "someone-else"))
		wantClass(t, err, providers.ErrPermanent)
	})

	t.Run("get reports provisioning while the guest has no address", func(t *testing.T) {
		inst, err := p.Get(ctx(t), id)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		// The test image boots no OS, so no source knows an address.
		if inst.State != providers.StateProvisioning || inst.IP != "" || inst.OwnerUID != uid || inst.CreatedAt.IsZero() {
			t.Fatalf("Get = %+v, want Provisioning without an IP, with the mark's uid and time", inst)
		}
	})

	t.Run("list by tag keeps only marked domains", func(t *testing.T) {
		foreign, err := lv.DomainDefineXMLFlags(`<domain type="qemu"><name>not-ours</name><memory unit="MiB">64</memory><os><type>hvm</type></os></domain>`, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lv.DomainUndefine(foreign) }()
		// A domain whose proxyfleet metadata cannot be read as a mark is
		// skipped, not a reason to fail the whole sweep.
		unreadable, err := lv.DomainDefineXMLFlags(`<domain type="qemu"><name>unreadable-mark</name><memory unit="MiB">64</memory><os><type>hvm</type></os>
<metadata><proxyfleet:other xmlns:proxyfleet="`+MetadataNS+`" managed="true"/></metadata></domain>`, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lv.DomainUndefine(unreadable) }()
		raw, err := lv.DomainGetMetadata(unreadable, int32(libvirt.DomainMetadataElement), libvirt.OptString{MetadataNS}, 0)
		if _, perr := parseMark(raw); err != nil || perr == nil {
			t.Fatalf("want libvirt to return our namespace's element and the mark parser to refuse it: %q, %v, %v", raw, err, perr)
		}
		list, err := p.ListByTag(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].ProviderID != id || list[0].OwnerUID != uid || list[0].CreatedAt.IsZero() {
			t.Fatalf("ListByTag = %+v, want only %s", list, id)
		}
		_, err = p.Create(ctx(t), request("not-ours", "u"))
		wantClass(t, err, providers.ErrPermanent)
		err = p.Delete(ctx(t), FormatProviderID("local", "not-ours"))
		wantClass(t, err, providers.ErrPermanent)
		if _, err := lv.DomainLookupByName("not-ours"); err != nil {
			t.Fatalf("Delete touched a domain without the mark: %v", err)
		}
	})

	t.Run("check reports the host and its pool", func(t *testing.T) {
		st := p.Check(ctx(t))
		if len(st) != 1 || !st[0].Ready || st[0].Reason != ReasonOK || st[0].Details["poolState"] != "running" ||
			st[0].Details["libvirtVersion"] == "" || st[0].Details["hostname"] == "" || st[0].Details["poolAvailableGiB"] == "" {
			t.Fatalf("Check = %+v", st)
		}
	})

	t.Run("delete destroys, undefines and removes the volumes; again is fine", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			if err := p.Delete(ctx(t), id); err != nil {
				t.Fatalf("Delete #%d: %v", i+1, err)
			}
		}
		if _, err := lv.DomainLookupByName(name); err == nil {
			t.Fatal("the domain is still defined")
		}
		_, err := p.Get(ctx(t), id)
		wantClass(t, err, providers.ErrNotFound)
		files := f.lv.PoolFiles(t)
		if !slices.Equal(files, []string{"base-kvm-test-tiny.qcow2", "base-kvm-test-tiny.qcow2.sha256-" + f.images.digest}) {
			t.Fatalf("pool after Delete = %v, want only the cached base and its marker", files)
		}
	})
}

func mustVol(t *testing.T, lv *libvirt.Libvirt, pool, name string) libvirt.StorageVol {
	t.Helper()
	pl, err := lv.StoragePoolLookupByName(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := lv.StoragePoolRefresh(pl, 0); err != nil {
		t.Fatal(err)
	}
	v, err := lv.StorageVolLookupByName(pl, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFailuresAgainstRealLibvirtOverSSH covers what real hosts taught:
// each case fails one way, with one class, and leaves nothing behind.
func TestFailuresAgainstRealLibvirtOverSSH(t *testing.T) {
	f := startFixture(t)
	p := newProvider(t, f.config())

	t.Run("a download that breaks off half way is transient, leaks nothing and does not deadlock", func(t *testing.T) {
		// The pooled connection's own goroutines are part of the baseline.
		_, err := p.Get(ctx(t), FormatProviderID("local", "proxy-warmup"))
		wantClass(t, err, providers.ErrNotFound)
		f.images.CloseClientConnections()
		time.Sleep(200 * time.Millisecond)
		before := runtime.NumGoroutine()
		req := request("proxy-broken000000a", "uid-broken")
		req.Placement.Image = "broken"
		done := make(chan error, 1)
		go func() { _, err := p.Create(ctx(t), req); done <- err }()
		select {
		case err := <-done:
			wantClass(t, err, providers.ErrTransient)
			if !strings.Contains(err.Error(), "broke off") {
				t.Fatalf("err = %v, want it to say the download broke off", err)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("Create is stuck after the download broke off (the upload stream deadlocked)")
		}
		if files := f.lv.PoolFiles(t); slices.ContainsFunc(files, func(s string) bool { return strings.Contains(s, "broken") }) {
			t.Fatalf("a half-written base was left in the pool: %v", files)
		}
		poll.Until(t, 30*time.Second, "the goroutines of the failed download to end", func() error {
			f.images.CloseClientConnections()
			if n := runtime.NumGoroutine(); n > before+1 {
				buf := make([]byte, 1<<16)
				return errors.New("goroutines: " + strconv.Itoa(before) + " before, " + strconv.Itoa(n) + " after:\n" + string(buf[:runtime.Stack(buf, true)]))
			}
			return nil
		})
		// The provider still works on the same host.
		if st := p.Check(ctx(t)); !st[0].Ready {
			t.Fatalf("Check after the broken download = %+v", st)
		}
	})

	t.Run("a digest mismatch on download is permanent and leaves no base", func(t *testing.T) {
		req := request("proxy-wrongsum0000a", "uid-wrongsum")
		req.Placement.Image = "wrongsum"
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrPermanent)
		if files := f.lv.PoolFiles(t); slices.ContainsFunc(files, func(s string) bool { return strings.Contains(s, "wrongsum") }) {
			t.Fatalf("a base with the wrong digest was kept: %v", files)
		}
	})

	t.Run("an image the server does not have is permanent", func(t *testing.T) {
		req := request("proxy-missing00000a", "uid-missing")
		req.Placement.Image = "missing"
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrPermanent)
	})

	t.Run("a domain that dies right after its start is transient and undone", func(t *testing.T) {
		// A real guest runs here: SeaBIOS boots the raw image's boot sector,
		// which powers the machine off.
		req := request("proxy-poweroff0000a", "uid-poweroff")
		req.Placement.Image = "poweroff"
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrTransient)
		if !strings.Contains(err.Error(), "stopped right after starting") {
			t.Fatalf("err = %v, want the start watch to report the dead domain\n%s", err, f.lv.GuestLog(req.Name))
		}
		wantNothingOf(t, f, req.Name)
	})

	t.Run("a define the host refuses is permanent and leaves no volume", func(t *testing.T) {
		req := request("proxy-toomany00000a", "uid-toomany")
		req.Placement.MachineType = "toomany"
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrPermanent)
		if !strings.Contains(err.Error(), "defining domain") {
			t.Fatalf("err = %v, want libvirt's refusal at define", err)
		}
		wantNothingOf(t, f, req.Name)
	})

	t.Run("a guest CPU the host refuses names kvm.cpuMode and what to set instead", func(t *testing.T) {
		cfg := f.config()
		cfg.CPUMode = "pf-no-such-cpu"
		p := newProvider(t, cfg)
		req := request("proxy-nocpu0000000a", "uid-nocpu")
		_, err := p.Create(ctx(t), req)
		if err == nil || !strings.Contains(err.Error(), "pf-no-such-cpu") ||
			!strings.Contains(err.Error(), "kvm.cpuMode is pf-no-such-cpu; set kvm.cpuMode to host-model or a CPU model this host runs") {
			t.Fatalf("err = %v, want libvirt's refusal of the CPU model with the kvm.cpuMode advice", err)
		}
		wantNothingOf(t, f, req.Name)
	})

	t.Run("a start the host refuses removes the defined domain and its volumes", func(t *testing.T) {
		cfg := f.config()
		// The bridge does not exist on the host: libvirt defines the
		// domain and refuses to start it.
		cfg.Hosts = append(cfg.Hosts, Host{Name: "nobridge", Address: f.sshd.Addr, Pool: f.lv.PoolName, Bridge: "pfnosuchbr0"})
		p := newProvider(t, cfg)
		req := request("proxy-nobridge0000a", "uid-nobridge")
		req.Placement.Zone = "nobridge"
		_, err := p.Create(ctx(t), req)
		if err == nil || !strings.Contains(err.Error(), "starting domain") {
			t.Fatalf("err = %v, want libvirt's refusal at start", err)
		}
		wantNothingOf(t, f, req.Name)
		id, err := p.ProviderIDFor(req)
		if err != nil || id != FormatProviderID("nobridge", req.Name) {
			t.Fatalf("ProviderIDFor = %q, %v", id, err)
		}
		if err := p.Delete(ctx(t), id); err != nil {
			t.Fatalf("Delete of the derived ID after a failed Create = %v, want nil", err)
		}
	})

	t.Run("what a cut-off Create left is reused by the next Create and removed by a Delete of the derived ID", func(t *testing.T) {
		req := request("proxy-cutoff00000a", "uid-cutoff")
		leaveVolumes(t, p, req)
		overlay := filepath.Join(f.lv.PoolDir, overlayVolumeName(req.Name))
		before, err := os.Stat(overlay)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Create(ctx(t), req); err != nil {
			t.Fatalf("Create over the leftovers: %v", err)
		}
		after, err := os.Stat(overlay)
		if err != nil || !os.SameFile(before, after) {
			t.Fatalf("the overlay was not reused (err %v)", err)
		}
		lv := f.lv.Connect(t)
		defer func() { _ = lv.Disconnect() }()
		f.lv.RequireRunning(t, lv, req.Name)
		id, err := p.ProviderIDFor(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Delete(ctx(t), id); err != nil {
			t.Fatal(err)
		}
		wantNothingOf(t, f, req.Name)

		leaveVolumes(t, p, req)
		if err := p.Delete(ctx(t), id); err != nil {
			t.Fatal(err)
		}
		wantNothingOf(t, f, req.Name)
	})

	t.Run("a mark volume of another UID is permanent and left alone", func(t *testing.T) {
		req := request("proxy-othermark000a", "uid-mine")
		other := req
		other.OwnerUID = "uid-theirs"
		leaveVolumes(t, p, other)
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrPermanent)
		theirs := func(s string) bool {
			return strings.HasPrefix(s, req.Name+".uid-theirs.") && strings.HasSuffix(s, markSuffix)
		}
		if files := f.lv.PoolFiles(t); !slices.ContainsFunc(files, theirs) || !slices.Contains(files, overlayVolumeName(req.Name)) {
			t.Fatalf("another UID's volumes were touched: %v", files)
		}
		if err := p.Delete(ctx(t), FormatProviderID("local", req.Name)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("list by tag finds a cut-off guest's volumes and a stopped domain by their mark, never an unmarked volume", func(t *testing.T) {
		stray := request("proxy-stray000000a", "uid-stray")
		leaveVolumes(t, p, stray)
		stopped := request("proxy-stopped00000a", "uid-stopped")
		if _, err := p.Create(ctx(t), stopped); err != nil {
			t.Fatal(err)
		}
		lv := f.lv.Connect(t)
		defer func() { _ = lv.Disconnect() }()
		dom, err := lv.DomainLookupByName(stopped.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := lv.DomainDestroy(dom); err != nil {
			t.Fatal(err)
		}
		pool, err := lv.StoragePoolLookupByName(f.lv.PoolName)
		if err != nil {
			t.Fatal(err)
		}
		// Named like a guest's volumes, but without a mark: not provably ours.
		unmarked := []string{"proxy-unmarked0000a.qcow2", "proxy-unmarked0000a-seed.iso", "data.qcow2"}
		for _, n := range unmarked {
			if _, err := lv.StorageVolCreateXML(pool, rawVolumeXML(n, 4096), 0); err != nil {
				t.Fatal(err)
			}
		}
		list, err := p.ListByTag(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, inst := range list {
			got = append(got, inst.ProviderID+" "+inst.OwnerUID+" "+strings.Join(inst.Parts, ","))
		}
		want := []string{
			FormatProviderID("local", stopped.Name) + " uid-stopped domain,overlay,seed,mark",
			FormatProviderID("local", stray.Name) + " uid-stray overlay,seed,mark",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("ListByTag = %q, want %q", got, want)
		}
		for _, r := range []providers.CreateRequest{stray, stopped} {
			if err := p.Delete(ctx(t), FormatProviderID("local", r.Name)); err != nil {
				t.Fatal(err)
			}
			wantNothingOf(t, f, r.Name)
		}
		files := f.lv.PoolFiles(t)
		for _, n := range unmarked {
			if !slices.Contains(files, n) {
				t.Fatalf("unmarked volume %s is gone: %v", n, files)
			}
			_ = lv.StorageVolDelete(mustVol(t, lv, f.lv.PoolName, n), 0)
		}
	})

	t.Run("a full pool is quota exceeded and defines nothing", func(t *testing.T) {
		req := request("proxy-huge0000000a", "uid-huge")
		req.Placement.MachineType = "huge"
		_, err := p.Create(ctx(t), req)
		wantClass(t, err, providers.ErrQuotaExceeded)
		lv := f.lv.Connect(t)
		defer func() { _ = lv.Disconnect() }()
		if _, err := lv.DomainLookupByName(req.Name); err == nil {
			t.Fatal("a domain was defined although the pool is too small")
		}
	})

	t.Run("a cached base whose digest the config no longer matches is permanent and kept", func(t *testing.T) {
		if _, err := p.Create(ctx(t), request("proxy-cached00000a", "uid-cached")); err != nil {
			t.Fatal(err)
		}
		if err := p.Delete(ctx(t), FormatProviderID("local", "proxy-cached00000a")); err != nil {
			t.Fatal(err)
		}
		cfg := f.config()
		cfg.Images["tiny"] = Image{URL: cfg.Images["tiny"].URL, SHA256: strings.Repeat("a", 64)}
		edited := newProvider(t, cfg)
		_, err := edited.Create(ctx(t), request("proxy-edited00000a", "uid-edited"))
		wantClass(t, err, providers.ErrPermanent)
		if files := f.lv.PoolFiles(t); !slices.Contains(files, "base-kvm-test-tiny.qcow2") || !slices.Contains(files, "base-kvm-test-tiny.qcow2.sha256-"+f.images.digest) {
			t.Fatalf("the live base or its marker was deleted: %v", files)
		}
	})

	t.Run("a base with markers that disagree is debris: both go and the image is fetched again", func(t *testing.T) {
		lv := f.lv.Connect(t)
		defer func() { _ = lv.Disconnect() }()
		pool, err := lv.StoragePoolLookupByName(f.lv.PoolName)
		if err != nil {
			t.Fatal(err)
		}
		stale := "base-kvm-test-tiny.qcow2.sha256-" + strings.Repeat("b", 64)
		if _, err := lv.StorageVolCreateXML(pool, rawVolumeXML(stale, 0), 0); err != nil {
			t.Fatal(err)
		}
		before := f.images.count("/tiny.qcow2")
		req := request("proxy-debris00000a", "uid-debris")
		if _, err := p.Create(ctx(t), req); err != nil {
			t.Fatal(err)
		}
		if n := f.images.count("/tiny.qcow2"); n != before+1 {
			t.Fatalf("image downloaded %d more times, want 1", n-before)
		}
		files := f.lv.PoolFiles(t)
		if slices.Contains(files, stale) || !slices.Contains(files, "base-kvm-test-tiny.qcow2.sha256-"+f.images.digest) {
			t.Fatalf("pool = %v, want the stale marker gone and one marker with the image's digest", files)
		}
		if err := p.Delete(ctx(t), FormatProviderID("local", req.Name)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("concurrent creates of one name serialise into one domain", func(t *testing.T) {
		req := request("proxy-concurrent00a", "uid-concurrent")
		errs := make(chan error, 3)
		for i := 0; i < 3; i++ {
			go func() { _, err := p.Create(ctx(t), req); errs <- err }()
		}
		for i := 0; i < 3; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("concurrent Create: %v", err)
			}
		}
		lv := f.lv.Connect(t)
		defer func() { _ = lv.Disconnect() }()
		doms, _, err := lv.ConnectListAllDomains(1, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, d := range doms {
			if d.Name == req.Name {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d domains named %s, want 1", n, req.Name)
		}
		if err := p.Delete(ctx(t), FormatProviderID("local", req.Name)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a call that outlives its budget kills the connection and the next call redials", func(t *testing.T) {
		p := newProvider(t, f.config())
		id := FormatProviderID("local", "proxy-budget")
		_, err := p.Get(ctx(t), id)
		wantClass(t, err, providers.ErrNotFound)
		first := p.conns["local"].cur
		p.cfg.Budgets.RPC = time.Nanosecond
		_, err = p.Get(ctx(t), id)
		wantClass(t, err, providers.ErrTransient)
		if !strings.Contains(err.Error(), "budget") || first.alive() {
			t.Fatalf("err = %v, link alive = %v; want a budget overrun that killed the link", err, first.alive())
		}
		p.cfg.Budgets.RPC = 30 * time.Second
		_, err = p.Get(ctx(t), id)
		wantClass(t, err, providers.ErrNotFound)
		if p.conns["local"].cur == first {
			t.Fatal("the next call reused the killed link instead of redialing")
		}
	})

	t.Run("a host that is not configured: get is permanent, delete is a no-op", func(t *testing.T) {
		_, err := p.Get(ctx(t), FormatProviderID("gone", "proxy-x"))
		wantClass(t, err, providers.ErrPermanent)
		if err := p.Delete(ctx(t), FormatProviderID("gone", "proxy-x")); err != nil {
			t.Fatalf("Delete on an unconfigured host = %v, want nil", err)
		}
	})

	other := sshd.NewKey(t, filepath.Join(t.TempDir(), "other"))
	wrongKnownHosts := filepath.Join(t.TempDir(), "known_hosts")
	f.sshd.WriteKnownHosts(t, wrongKnownHosts, other.PublicKey())
	unauthorizedKey := filepath.Join(t.TempDir(), "stranger")
	sshd.NewKey(t, unauthorizedKey)
	emptyKnownHosts := filepath.Join(t.TempDir(), "known_hosts_empty")
	if err := os.WriteFile(emptyKnownHosts, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadAddr := testutil.RefusedAddr(t)
	notAKey := filepath.Join(t.TempDir(), "id.pub")
	if err := os.WriteFile(notAKey, []byte("ssh-ed25519 AAAA not a private key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sshCases := []struct {
		name       string
		edit       func(*Config)
		class      error
		checkReady bool
		reason     string
	}{
		{"a host key that does not match known_hosts is permanent", func(c *Config) { c.KnownHosts = wrongKnownHosts }, providers.ErrPermanent, false, ReasonAuthFailed},
		{"a key the host does not authorise is permanent", func(c *Config) { c.KeyFile = unauthorizedKey }, providers.ErrPermanent, false, ReasonAuthFailed},
		{"a key file that does not parse is permanent", func(c *Config) { c.KeyFile = notAKey }, providers.ErrPermanent, false, ReasonAuthFailed},
		{"a host key missing from known_hosts is permanent", func(c *Config) { c.KnownHosts = emptyKnownHosts }, providers.ErrPermanent, false, ReasonAuthFailed},
		{"a host where nothing listens is transient", func(c *Config) { c.Hosts[0].Address = deadAddr }, providers.ErrTransient, false, ReasonUnreachable},
		{"a missing key file is transient", func(c *Config) { c.KeyFile = filepath.Join(t.TempDir(), "not-yet") }, providers.ErrTransient, false, ReasonUnreachable},
		{"a missing known_hosts file is transient", func(c *Config) { c.KnownHosts = filepath.Join(t.TempDir(), "not-yet") }, providers.ErrTransient, false, ReasonUnreachable},
	}
	for _, tc := range sshCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config()
			tc.edit(&cfg)
			bad := newProvider(t, cfg)
			_, err := bad.Get(ctx(t), FormatProviderID("local", "proxy-any"))
			wantClass(t, err, tc.class)
			if st := bad.Check(ctx(t)); st[0].Ready != tc.checkReady || st[0].Reason != tc.reason {
				t.Fatalf("Check = %+v, want reason %s", st[0], tc.reason)
			}
		})
	}

	t.Run("the key files are read on every dial, so a file that arrives later heals", func(t *testing.T) {
		cfg := f.config()
		late := filepath.Join(t.TempDir(), "late_key")
		cfg.KeyFile = late
		p := newProvider(t, cfg)
		_, err := p.Get(ctx(t), FormatProviderID("local", "proxy-nothing"))
		wantClass(t, err, providers.ErrTransient)
		key, err := os.ReadFile(f.sshd.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(late, key, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = p.Get(ctx(t), FormatProviderID("local", "proxy-nothing"))
		wantClass(t, err, providers.ErrNotFound)
	})
}

// wantNothingOf fails unless the host has no domain and no volume of the
// guest name.
func wantNothingOf(t *testing.T, f *fixture, name string) {
	t.Helper()
	lv := f.lv.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	if _, err := lv.DomainLookupByName(name); err == nil {
		t.Fatalf("domain %s is still defined", name)
	}
	if files := f.lv.PoolFiles(t); slices.ContainsFunc(files, func(s string) bool { return strings.HasPrefix(s, name) }) {
		t.Fatalf("volumes of %s were left in the pool: %v", name, files)
	}
}

// leaveVolumes leaves what a Create killed after its seed upload leaves:
// the guest's mark, overlay and seed, no domain.
func leaveVolumes(t *testing.T, p *Provider, req providers.CreateRequest) {
	t.Helper()
	pl, err := p.resolve(req.Placement)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := p.lookupPool(ctx(t), pl.host.Name, pl.host.Pool)
	if err != nil {
		t.Fatal(err)
	}
	base, err := p.ensureImage(ctx(t), pl, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.markGuest(ctx(t), pl.host.Name, pool, req.Name, Mark{Managed: true, UID: req.OwnerUID, CreatedAt: p.now().UTC().Truncate(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ensureOverlay(ctx(t), pl.host.Name, pool, req.Name, uint64(pl.machine.DiskGiB)<<30, base); err != nil {
		t.Fatal(err)
	}
	seed, err := p.seedFor(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.writeSeed(ctx(t), pl.host.Name, pool, req.Name, seed); err != nil {
		t.Fatal(err)
	}
}
