// Package libvirtd runs a private, real libvirtd driving real QEMU for a
// test (Start, StartWith), in namespaces of its own so that nothing is
// shared with a system daemon or another test, and the hosts the kvm
// provider is tested on: a KVMHost (the libvirtd reached over a real sshd,
// with a tiny base image served over HTTP) and a GuestHost, whose Debian
// guest really boots, with its serial consoles recorded; BootSeeded boots
// the same image as another cloud would, from a NoCloud seed.
//
// It imports internal/testkit/sshd, internal/testutil, internal/testutil/poll
// and providers/nocloud (the seed ISO a guest boots with), and nothing else
// of ours: never the kvm provider it serves (whose tests import this), the
// controller, or another launcher.
package libvirtd

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// Daemon is a private, real libvirtd (Debian's, privileged, driving real
// QEMU) started for one test. It runs in its own mount, network and PID
// namespaces: tmpfs over libvirt's state, config and cache directories (so
// nothing is shared with a system daemon or another test's), a network
// namespace of its own (the guests' bridge never touches the machine's
// network), and a PID namespace whose end kills every QEMU it started. Its
// socket lives in the test's temp dir, where an sshd on the host can forward it.
type Daemon struct {
	// Dir is the test's directory: the socket, the pool, the logs.
	Dir string
	// Socket is the read-write libvirt socket.
	Socket string
	// PoolName, PoolDir: a running dir pool in Dir.
	PoolName, PoolDir string
	// Network is an isolated libvirt network (a bridge with no uplink;
	// DHCP only with Options.GuestSubnet) guests can attach to.
	Network string
	// DomainType is "kvm" when a UEFI guest runs under KVM here, else
	// "qemu" (TCG), with KVMReason saying why.
	DomainType, KVMReason string

	proc *testutil.Process
	// consoles is what RecordConsoles records, for GuestReport.
	consoles atomic.Pointer[Consoles]
}

// libvirtdRun is the namespace's init script: private state directories,
// libvirt's QEMU settings for a test (QEMU as root without a security
// driver, since the disks live in a temp dir; console output to a file), a
// loopback, /run/lock (where libvirt locks a console's pty; /var/lock
// points there), then libvirtd under a bash that, as the namespace's PID 1,
// reaps the QEMU processes libvirt daemonises.
const libvirtdRun = `set -e
for d in /var/lib/libvirt /var/cache/libvirt /etc/libvirt /run; do mount -t tmpfs tmpfs "$d"; done
mkdir -p /var/log/libvirt /run/libvirt /run/lock
mount --bind "$PF_DIR/log" /var/log/libvirt
cp "$PF_DIR/qemu.conf" /etc/libvirt/qemu.conf
ip link set lo up
/usr/sbin/libvirtd --config "$PF_DIR/libvirtd.conf" --pid-file "$PF_DIR/libvirtd.pid" &
daemon=$!
trap 'kill -TERM $daemon' TERM INT
# As PID 1 of the namespace this shell inherits every daemonised QEMU; bash
# reaps them, so a destroyed guest never lingers as a zombie that libvirt
# would wait on.
while kill -0 "$daemon" 2>/dev/null; do wait; done
`

// Options changes what StartWith sets up.
type Options struct {
	// SharedNetNS keeps libvirtd, and so the guests' bridge, in the
	// caller's network namespace instead of one of its own: for a test
	// that runs in a namespace it made (testutil.InNetNS) and whose processes must
	// reach the guests.
	SharedNetNS bool
	// GuestSubnet, when set, gives the network an address on its bridge
	// (the subnet's first) and a DHCP server (libvirt's dnsmasq, without
	// DNS) leasing from the subnet's .10 to .99 (an IPv4 /24).
	GuestSubnet netip.Prefix
}

// Start starts the daemon and waits until it answers. It fails the
// test, loudly and with the reason, when libvirtd, QEMU or the namespaces
// are not available: hack/install-deps.sh installs the packages.
func Start(t testing.TB) *Daemon {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Daemon {
	t.Helper()
	if opts.GuestSubnet.IsValid() && (!opts.GuestSubnet.Addr().Is4() || opts.GuestSubnet.Bits() != 24) {
		t.Fatalf("libvirt test harness: GuestSubnet %s is not an IPv4 /24", opts.GuestSubnet)
	}
	for _, bin := range []string{"/usr/sbin/libvirtd", "/usr/bin/qemu-system-x86_64", "/usr/bin/qemu-img", "/usr/bin/unshare"} {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("libvirt test harness: %s is missing (run hack/install-deps.sh as root: libvirt-daemon-system qemu-system-x86 qemu-utils ovmf): %v", bin, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("libvirt test harness: a private system libvirtd needs root (namespaces, tmpfs mounts); run the tests as root")
	}
	dir, err := os.MkdirTemp("", "pf-libvirt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	d := &Daemon{Dir: dir, Socket: filepath.Join(dir, "sock", "libvirt-sock"), PoolName: "pf-pool", PoolDir: filepath.Join(dir, "pool"), Network: "pf-net"}
	for _, sub := range []string{"sock", "log", "pool"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("libvirtd.conf", fmt.Sprintf("unix_sock_dir = %q\nunix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n", filepath.Join(dir, "sock")))
	write("qemu.conf", "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = 0\nsecurity_driver = \"none\"\nstdio_handler = \"file\"\n")
	write("run.sh", libvirtdRun)
	namespaces := []string{"--mount", "--net", "--pid"}
	if opts.SharedNetNS {
		namespaces = []string{"--mount", "--pid"}
	}
	proc, err := testutil.LaunchProcess("/usr/bin/unshare", testutil.ProcessOptions{
		Name: "libvirtd",
		Args: append(namespaces, "--fork", "--mount-proc", "--propagation", "private", "--kill-child=SIGKILL",
			"/bin/bash", filepath.Join(dir, "run.sh")),
		Env: []string{"PF_DIR=" + dir},
	})
	if err != nil {
		t.Fatalf("libvirt test harness: %v", err)
	}
	d.proc = proc
	t.Cleanup(func() {
		// unshare ignores SIGTERM while it waits for its child; SIGKILL
		// makes the kernel kill the namespace's PID 1 (--kill-child), and
		// with it libvirtd and every QEMU it started.
		_ = proc.Signal(syscall.SIGKILL)
		_, _ = proc.Wait(30 * time.Second)
		if t.Failed() {
			t.Logf("libvirtd output:\n%s", proc.Output())
		}
	})
	if err := poll.Wait(30*time.Second, "the private libvirtd's socket", func() error {
		if d.proc.Exited() {
			return fmt.Errorf("libvirtd exited: %v\n%s", d.proc.ExitErr(), d.proc.Output())
		}
		// The socket file appears at bind(2), before libvirtd listens:
		// only a connection that is accepted says it is up (a check of the
		// file alone once let the first Connect meet ECONNREFUSED).
		c, err := net.DialTimeout("unix", d.Socket, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		t.Fatalf("libvirt test harness: the private libvirtd did not come up: %v", err)
	}
	lv := d.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	if _, err := lv.NetworkCreateXML(networkXML(d.Network, opts.GuestSubnet)); err != nil {
		t.Fatalf("libvirt test harness: creating the isolated network: %v", err)
	}
	if _, err := lv.StoragePoolCreateXML(`<pool type="dir"><name>`+d.PoolName+`</name><target><path>`+d.PoolDir+`</path></target></pool>`, 0); err != nil {
		t.Fatalf("libvirt test harness: creating the dir pool: %v", err)
	}
	d.DomainType, d.KVMReason = probeKVM(lv, dir)
	t.Logf("libvirt test harness: libvirtd up at %s, guests use domain type %q (%s)", d.Socket, d.DomainType, d.KVMReason)
	return d
}

// networkXML is an isolated network (no forwarding out of it) on bridge
// pfbr0; with a subnet, the bridge has its first address and dnsmasq leases
// .10-.99 of it, with DNS off.
func networkXML(name string, subnet netip.Prefix) string {
	x := `<network><name>` + name + `</name><bridge name="pfbr0"/>`
	if subnet.IsValid() {
		b := subnet.Masked().Addr().As4()
		at := func(last byte) string { return netip.AddrFrom4([4]byte{b[0], b[1], b[2], last}).String() }
		x += `<dns enable="no"/><ip address="` + at(1) + `" netmask="255.255.255.0"><dhcp><range start="` + at(10) + `" end="` + at(99) + `"/></dhcp></ip>`
	}
	return x + `</network>`
}

// Connect opens a direct libvirt connection (no SSH) for the test's own
// checks; the caller disconnects it.
func (d *Daemon) Connect(t testing.TB) *libvirt.Libvirt {
	t.Helper()
	lv, err := d.dial()
	if err != nil {
		t.Fatalf("connecting to libvirtd: %v", err)
	}
	return lv
}

// RequireRunning fails t unless lv knows domain name and it is running;
// the failure carries the guest's QEMU log.
func (d *Daemon) RequireRunning(t testing.TB, lv *libvirt.Libvirt, name string) {
	t.Helper()
	dom, err := lv.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("the domain was not defined: %v", err)
	}
	if st, _, err := lv.DomainGetState(dom, 0); err != nil || libvirt.DomainState(st) != libvirt.DomainRunning {
		t.Fatalf("domain state %d (err %v), want running\n%s", st, err, d.GuestReport(name))
	}
}

// PoolFiles lists the file names in the pool directory.
func (d *Daemon) PoolFiles(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir(d.PoolDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// GuestReport is what a failure about a domain shows: the tail of its
// serial console when RecordConsoles records it (the kernel, systemd,
// cloud-init: how far the guest got) and the tail of its QEMU log.
func (d *Daemon) GuestReport(name string) string {
	var console string
	if c := d.consoles.Load(); c != nil {
		console = "--- serial console of " + name + " ---\n" + c.Tail(name, 200) + "\n"
	}
	return console + "--- QEMU log of " + name + " ---\n" + d.GuestLog(name)
}

// GuestLog is the tail of a domain's QEMU log.
func (d *Daemon) GuestLog(name string) string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "log", "qemu", name+".log"))
	s := string(b)
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// probeKVM decides the domain type tests use: it boots a diskless UEFI
// guest under KVM with the host CPU passed through (the kvm provider's
// default cpuMode) and keeps "kvm" only if the guest is still running a
// moment later. /dev/kvm opening is not enough: under nested virtualisation
// KVM may open and still fail to run OVMF (the guest pauses on an emulation
// failure).
func probeKVM(lv *libvirt.Libvirt, dir string) (domainType, reason string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "qemu", "/dev/kvm cannot be opened: " + err.Error()
	}
	_ = f.Close()
	const name = "pf-kvm-probe"
	dom, err := lv.DomainDefineXMLFlags(`<domain type="kvm"><name>`+name+`</name><memory unit="MiB">128</memory><vcpu>1</vcpu>
<os firmware="efi"><type arch="x86_64" machine="q35">hvm</type><firmware><feature enabled="no" name="secure-boot"/></firmware></os>
<features><acpi/><apic/></features><cpu mode="host-passthrough"/><devices><serial type="pty"/></devices></domain>`, 0)
	if err != nil {
		return "qemu", "defining a KVM guest failed: " + err.Error()
	}
	defer func() {
		_ = lv.DomainDestroy(dom)
		_ = lv.DomainUndefineFlags(dom, libvirt.DomainUndefineNvram)
	}()
	if err := lv.DomainCreate(dom); err != nil {
		if strings.Contains(err.Error(), "failed to set MSR") {
			return "qemu", "KVM refuses the host CPU (failed to set MSR: nested virtualisation; kvm.cpuMode host-model is an operator's way out): " + err.Error()
		}
		return "qemu", "starting a KVM guest failed: " + err.Error()
	}
	time.Sleep(3 * time.Second)
	st, _, err := lv.DomainGetState(dom, 0)
	if err != nil {
		return "qemu", "reading the KVM guest's state failed: " + err.Error()
	}
	if libvirt.DomainState(st) != libvirt.DomainRunning {
		log, _ := os.ReadFile(filepath.Join(dir, "log", "qemu", name+".log"))
		why := "state " + fmt.Sprint(st)
		switch {
		case strings.Contains(string(log), "emulation failure"):
			why = "KVM emulation failure under OVMF (nested virtualisation)"
		case strings.Contains(string(log), "failed to set MSR"):
			why = "KVM refuses the host CPU (failed to set MSR: nested virtualisation)"
		}
		return "qemu", "/dev/kvm opens but a UEFI guest does not run under KVM: " + why
	}
	return "kvm", "a UEFI guest runs under KVM"
}

// QemuImgCreate makes a qcow2 image of virtual size size (e.g. "64M") at path.
func QemuImgCreate(t testing.TB, path, size string) []byte {
	t.Helper()
	if out, err := exec.Command("/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", path, size).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// consoleTail bounds how much of each guest's serial console RecordConsoles keeps.
const consoleTail = 256 << 10

// Consoles records the serial console of every domain a libvirtd runs.
type Consoles struct {
	mu   sync.Mutex
	logs map[string]*testutil.TailBuffer // by domain name; a replaced domain's log goes on in the same buffer
}

// RecordConsoles attaches to the serial console of every domain that runs
// on d from now until the test ends, each over a connection of its own, and
// keeps the tail of what each printed: how a test shows what a guest did
// (the kernel, systemd, cloud-init's output). A domain is attached within
// about a second of starting; what it printed before that is in the pty's
// buffer, which libvirt hands over on attach.
func (d *Daemon) RecordConsoles(t testing.TB) *Consoles {
	t.Helper()
	c := &Consoles{logs: map[string]*testutil.TailBuffer{}}
	d.consoles.Store(c)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		attached := map[libvirt.UUID]bool{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			lv, err := d.dial()
			if err != nil {
				continue
			}
			doms, _, err := lv.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
			_ = lv.Disconnect()
			if err != nil {
				continue
			}
			for _, dom := range doms {
				if attached[dom.UUID] {
					continue
				}
				attached[dom.UUID] = true
				wg.Add(1)
				go func() { defer wg.Done(); d.recordConsole(dom, c.buffer(dom.Name), stop) }()
			}
		}
	}()
	return c
}

// recordConsole streams dom's console into buf until the domain stops or
// stop closes. A console opened before QEMU has its pty (right after the
// start) fails at once; it is opened again until the domain is gone.
func (d *Daemon) recordConsole(dom libvirt.Domain, buf *testutil.TailBuffer, stop <-chan struct{}) {
	for {
		lv, err := d.dial()
		if err != nil {
			fmt.Fprintf(buf, "\n[console: dialing libvirtd: %v]\n", err)
			return
		}
		done := make(chan error, 1)
		go func() {
			done <- lv.DomainOpenConsole(dom, libvirt.OptString{}, buf, uint32(libvirt.DomainConsoleForce))
		}()
		select {
		case err = <-done:
		case <-stop:
			_ = lv.Disconnect()
			<-done
			return
		}
		active, aerr := lv.DomainIsActive(dom)
		_ = lv.Disconnect()
		if aerr != nil || active == 0 {
			if err != nil {
				fmt.Fprintf(buf, "\n[console closed: %v]\n", err)
			}
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *Consoles) buffer(name string) *testutil.TailBuffer {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.logs[name]
	if !ok {
		b = testutil.NewTailBuffer(consoleTail)
		c.logs[name] = b
	}
	return b
}

// Tail is the last n lines of Log(name), carriage returns dropped.
func (c *Consoles) Tail(name string, n int) string {
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(c.Log(name), "\r", ""), "\n "), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Log is what domain name's console printed so far (the tail), "" when it
// was never attached.
func (c *Consoles) Log(name string) string {
	c.mu.Lock()
	b, ok := c.logs[name]
	c.mu.Unlock()
	if !ok {
		return ""
	}
	return b.String()
}

// dial opens a direct libvirt connection; the caller disconnects it.
func (d *Daemon) dial() (*libvirt.Libvirt, error) {
	c, err := net.DialTimeout("unix", d.Socket, 5*time.Second)
	if err != nil {
		return nil, err
	}
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		_ = c.Close()
		return nil, err
	}
	return lv, nil
}
