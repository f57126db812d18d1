package libvirtd

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/sshd"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// KVMHost is a real libvirtd reached over a real sshd, with a small qcow2
// base image served over HTTP: what a kvm provider entry needs, for tests
// that run the provider through the controller (in process or the binary).
type KVMHost struct {
	Libvirtd *Daemon
	SSHD     *sshd.Server
	// Config is a providers config file's YAML with one kvm entry,
	// "kvm-local", whose host "local" is this libvirtd and whose defaults
	// (image "tiny", machine type "small") make a Managed Proxy need no
	// placement.
	Config string
	// CachedBaseFiles are the pool's files once every guest is gone: the
	// cached base image and its digest marker.
	CachedBaseFiles []string
}

// cachedBaseFiles are the base image's volume and its marker, which
// carries the digest in its name, as the kvm provider names them.
func cachedBaseFiles(key, digest string) []string {
	base := "base-kvm-local-" + key + ".qcow2"
	return []string{base, base + ".sha256-" + digest}
}

// StartKVMHost starts the libvirtd, the sshd and the image server for the
// test; all stop at cleanup.
func StartKVMHost(t testing.TB) *KVMHost {
	t.Helper()
	lvd := Start(t)
	sd := sshd.Start(t)
	image := QemuImgCreate(t, filepath.Join(t.TempDir(), "tiny.qcow2"), "64M")
	sum := sha256.Sum256(image)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(image)))
		_, _ = w.Write(image)
	}))
	t.Cleanup(images.Close)
	digest := hex.EncodeToString(sum[:])
	cfg := kvmEntry(lvd, sd, "tiny", images.URL+"/tiny.qcow2", digest, "{vcpus: 1, memoryMiB: 256, diskGiB: 1}", "")
	return &KVMHost{Libvirtd: lvd, SSHD: sd, Config: cfg, CachedBaseFiles: cachedBaseFiles("tiny", digest)}
}

// kvmEntry is the providers config with one kvm entry, kvm-local, for lvd
// over sd: one image (key, url, digest), one machine type "small", both
// the defaults, and extra lines of the block appended.
func kvmEntry(lvd *Daemon, sd *sshd.Server, key, url, digest, machine, extra string) string {
	return `providers:
  - name: kvm-local
    type: kvm
    kvm:
      ssh: {user: ` + sd.User + `, privateKeyFile: ` + sd.KeyFile + `, knownHostsFile: ` + sd.KnownHostsFile + `, socket: ` + lvd.Socket + `}
      hosts: [{name: local, address: "` + sd.Addr + `", pool: ` + lvd.PoolName + `, network: ` + lvd.Network + `}]
      images: {` + key + `: {url: "` + url + `", sha256: ` + digest + `}}
      machineTypes: {small: ` + machine + `}
      defaults: {zone: local, image: ` + key + `, machineType: small}
      domainType: ` + lvd.DomainType + `
` + extra
}

// GuestSubnet is the range a GuestHost's guests get their addresses from
// by DHCP: TEST-NET-2, which no generated Squid refuses as a destination,
// so a target on the bridge (GuestHost.BridgeIP) is reachable through a
// guest while private ranges stay refused. It exists only in the test's
// own network namespace.
var GuestSubnet = netip.MustParsePrefix("198.51.100.0/24")

// GuestHost is a KVMHost whose image really boots: the Debian guest of
// make guest-image, on a network with DHCP, with libvirtd in the calling
// test's own network namespace (testutil.InNetNS), so the controller, the gateway
// and the targets the test starts there reach the guests and the guests
// reach them.
type GuestHost struct {
	*KVMHost
	// BridgeIP is the host's address on the guests' network, where a
	// target the guests can reach listens.
	BridgeIP string
	// Consoles records every guest's serial console.
	Consoles *Consoles
}

// GuestImagePath is the bootable guest image: $PROXYFLEET_GUEST_IMAGE
// (make e2e sets it), else bin/guest-image.qcow2 in the module. It fails
// the test, saying how to build it, when the file is missing.
func GuestImagePath(t testing.TB) string {
	t.Helper()
	path := os.Getenv("PROXYFLEET_GUEST_IMAGE")
	if path == "" {
		root, err := testutil.ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(root, "bin", "guest-image.qcow2")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the bootable guest image is missing (run make guest-image, which builds bin/guest-image.qcow2): %v", err)
	}
	return path
}

// StartGuestHost starts a GuestHost: libvirtd (sharing the test's network
// namespace, DHCP on GuestSubnet), the sshd, and an HTTP server for the
// image at imagePath with its sha256. Its kvm-local entry's machine type
// is one vCPU, 512 MiB and a 3 GiB overlay; the guest agent installer is
// off (the guest has no route to a package mirror here), so the address
// comes from the DHCP leases.
func StartGuestHost(t testing.TB, imagePath string) *GuestHost {
	t.Helper()
	lvd := StartWith(t, Options{SharedNetNS: true, GuestSubnet: GuestSubnet})
	consoles := lvd.RecordConsoles(t)
	sd := sshd.Start(t)
	f, err := os.Open(imagePath)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, imagePath)
	}))
	t.Cleanup(images.Close)
	digest := hex.EncodeToString(h.Sum(nil))
	cfg := kvmEntry(lvd, sd, "debian", images.URL+"/debian.qcow2", digest,
		"{vcpus: 1, memoryMiB: 512, diskGiB: 3}", "      installGuestAgent: false\n")
	b := GuestSubnet.Addr().As4()
	b[3] = 1
	return &GuestHost{KVMHost: &KVMHost{Libvirtd: lvd, SSHD: sd, Config: cfg, CachedBaseFiles: cachedBaseFiles("debian", digest)}, BridgeIP: netip.AddrFrom4(b).String(), Consoles: consoles}
}
