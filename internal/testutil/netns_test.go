package testutil

import (
	"net"
	"os"
	"slices"
	"strings"
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
	if slices.Sort(names); !slices.Equal(names, []string{"lo", "pfdefault0"}) {
		t.Fatalf("interfaces %v, want only lo and pfdefault0", names)
	}
	route, err := os.ReadFile("/proc/net/route")
	if err != nil || !strings.Contains(string(route), "pfdefault0\t00000000") {
		t.Fatalf("no default route into pfdefault0 (%v):\n%s", err, route)
	}
	tg := StartTarget(t, TargetOptions{Host: NetNSDefaultAddr})
	if tg.Host() != NetNSDefaultAddr {
		t.Fatalf("Target on %s, want %s", tg.Host(), NetNSDefaultAddr)
	}
}
