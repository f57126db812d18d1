package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netnsEnv marks the child process InNetNS starts: its value is the name
// of the test the child runs.
const netnsEnv = "PROXYFLEET_TEST_NETNS"

// NetNSDefaultAddr is the address of the interface that carries an InNetNS
// namespace's default route (TEST-NET-1): a bridge with no ports, which
// swallows whatever is sent along it, so nothing leaves the namespace.
// kube-apiserver needs a default route to choose the address it advertises.
const NetNSDefaultAddr = "192.0.2.1"

// NetNSDefaultDev is the name of that bridge, on which AddNetNSAddr puts
// the further addresses a test's sites listen on.
const NetNSDefaultDev = "pfdefault0"

// netnsSetup are the ip commands that make a new namespace usable: its
// loopback up, and a default route into a bridge without ports.
var netnsSetup = [][]string{
	{"link", "set", "lo", "up"},
	{"link", "add", NetNSDefaultDev, "type", "bridge"},
	{"addr", "add", NetNSDefaultAddr + "/24", "dev", NetNSDefaultDev},
	{"link", "set", NetNSDefaultDev, "up"},
	{"route", "add", "default", "dev", NetNSDefaultDev},
}

// InNetNS runs the calling top-level test in a network namespace of its
// own, made for it: the test binary starts itself again with only this test
// selected, in a new network namespace whose loopback is up and which has
// nothing else (no route out of it). It returns true in that child, where
// the test goes on; in the parent it waits for the child, passes its output
// on as the test's log and its result as the test's, and returns false, so
// the parent's copy of the test returns at once:
//
//	if !testutil.InNetNS(t) {
//		return
//	}
//
// Every process the child starts (envtest, sshd, libvirtd and its guests'
// bridge, the binaries under test) lives in that namespace; addresses there
// never reach the machine's network, so a test may give them any range.
func InNetNS(t *testing.T) bool {
	t.Helper()
	return InNamespaces(t, Namespaces{})
}

// Namespaces chooses the namespaces, besides a network namespace, that
// InNamespaces gives the test's child.
type Namespaces struct {
	// MountAndPID adds a mount namespace whose mounts are private (nothing
	// mounted there shows on the machine, and all of it goes with the
	// namespace) and a PID namespace of which the child is init, with a
	// /proc of its own: every process the child leaves behind, however it
	// was started (a container runtime's shims daemonize), is killed by
	// the kernel when the child ends. For tests that run a Kubernetes node.
	MountAndPID bool
}

// InNamespacesChild reports whether t is running in the child that
// InNetNS or InNamespaces started for it (their "true" side), for
// helpers that prepare the parent before the child starts.
func InNamespacesChild(t *testing.T) bool {
	return os.Getenv(netnsEnv) == t.Name()
}

// InNamespaces is InNetNS with the namespaces of ns as well.
func InNamespaces(t *testing.T, ns Namespaces) bool {
	t.Helper()
	if os.Getenv(netnsEnv) == t.Name() {
		if ns.MountAndPID {
			// The mounts were copied from the machine's, and those that are
			// shared would pass new mounts back: make all of them private
			// before anything is mounted, then give the namespace a /proc
			// that shows its own processes.
			if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
				t.Fatalf("netns: making the mounts private: %v", err)
			}
			if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
				t.Fatalf("netns: mounting /proc for the PID namespace: %v", err)
			}
		}
		for _, args := range netnsSetup {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("netns: ip %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Fatal("netns: a network namespace of the test's own needs root; run the tests as root")
	}
	if strings.Contains(t.Name(), "/") {
		t.Fatal("netns: InNetNS runs whole top-level tests, not subtests")
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.v=true", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), netnsEnv+"="+t.Name())
	flags := uintptr(syscall.CLONE_NEWNET)
	if ns.MountAndPID {
		flags |= syscall.CLONE_NEWNS | syscall.CLONE_NEWPID
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("netns: starting the test in a new network namespace: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			t.Log("netns| " + sc.Text())
		}
	}()
	err := cmd.Wait()
	_ = pw.Close()
	<-done
	if err != nil {
		t.Fatal(fmt.Errorf("netns: the test failed in its network namespace: %w", err))
	}
	return false
}

// AddNetNSAddr gives the interface carrying an InNetNS namespace's default
// route one more address of 192.0.2.0/24 (TEST-NET-1), so a second site
// stand-in can listen on an address of its own: the gateway's target key
// drops the port, so two sites need two hosts. Only in the namespace's
// child (InNamespacesChild); the address goes with the namespace.
func AddNetNSAddr(t testing.TB, ip string) {
	t.Helper()
	a, err := netip.ParseAddr(ip)
	if err != nil || !netip.MustParsePrefix(NetNSDefaultAddr+"/24").Masked().Contains(a) || ip == NetNSDefaultAddr {
		t.Fatalf("netns: %q is not another address of %s/24", ip, NetNSDefaultAddr)
	}
	if os.Getenv(netnsEnv) == "" {
		t.Fatalf("netns: adding %s outside a test's own network namespace (InNetNS)", ip)
	}
	if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", NetNSDefaultDev).CombinedOutput(); err != nil {
		t.Fatalf("netns: ip addr add %s: %v\n%s", ip, err, out)
	}
}
