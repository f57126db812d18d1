package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInNetNSRunsTheTestInANamespaceOfItsOwn starts a listener on this
// machine's loopback, then runs the rest of the test through InNetNS: in
// the child the listener is out of reach (its loopback is another), the
// only interfaces are the loopback and the bridge without ports carrying
// the default route, and a non-loopback Target may listen there.
func TestInNetNSRunsTheTestInANamespaceOfItsOwn(t *testing.T) {
	const parentAddr = "PROXYFLEET_TEST_NETNS_PARENT"
	if os.Getenv(netnsEnv) == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		t.Setenv(parentAddr, ln.Addr().String())
		if _, err := LaunchTarget(TargetOptions{Host: NetNSDefaultAddr}, false); err == nil {
			t.Fatal("a Target outside a test's own namespace listened on a non-loopback address")
		}
	}
	if !InNetNS(t) {
		return
	}
	if c, err := net.DialTimeout("tcp", os.Getenv(parentAddr), 2*time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("the namespace reached the parent's listener at %s", os.Getenv(parentAddr))
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ifc := range ifaces {
		names = append(names, ifc.Name)
	}
	if slices.Sort(names); !slices.Equal(names, []string{"lo", NetNSDefaultDev}) {
		t.Fatalf("interfaces %v, want only lo and %s", names, NetNSDefaultDev)
	}
	route, err := os.ReadFile("/proc/net/route")
	if err != nil || !strings.Contains(string(route), NetNSDefaultDev+"\t00000000") {
		t.Fatalf("no default route into %s (%v):\n%s", NetNSDefaultDev, err, route)
	}
	tg := StartTarget(t, TargetOptions{Host: NetNSDefaultAddr})
	if tg.Host() != NetNSDefaultAddr {
		t.Fatalf("Target on %s, want %s", tg.Host(), NetNSDefaultAddr)
	}
}

// TestInNamespacesMountAndPIDLeaveNothing runs the rest of the test in
// mount and PID namespaces as well: there the test is init with a /proc of
// its own, it mounts a tmpfs and leaves a daemonized process behind; once
// the child is done the parent sees neither the mount nor the process.
func TestInNamespacesMountAndPIDLeaveNothing(t *testing.T) {
	const markEnv = "PROXYFLEET_TEST_NS_MARK"
	if !InNamespacesChild(t) {
		dir := t.TempDir()
		t.Setenv(markEnv, dir)
		t.Cleanup(func() {
			mounts, err := os.ReadFile("/proc/self/mounts")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(mounts), dir) {
				t.Errorf("the child's mount on %s shows in the parent", dir)
			}
			out, _ := exec.Command("pgrep", "-f", "sleep 3600.5").CombinedOutput()
			if len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("the child's daemonized process outlived it: pids %s", out)
			}
		})
	}
	if !InNamespaces(t, Namespaces{MountAndPID: true}) {
		return
	}
	if os.Getpid() != 1 {
		t.Fatalf("the child is pid %d in its PID namespace, want 1", os.Getpid())
	}
	if err := syscall.Mount("tmpfs", os.Getenv(markEnv), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "3600.5")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", cmd.Process.Pid)); err != nil {
		t.Fatalf("the namespace's /proc does not show its own process %d: %v", cmd.Process.Pid, err)
	}
}
