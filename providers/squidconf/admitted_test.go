package squidconf

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
)

// update rewrites the golden files: go test ./providers/squidconf -run Golden -update
var update = flag.Bool("update", false, "rewrite testdata/*.golden.conf")

// TestAdmittedClusterRangesMatchTheGoldenFile pins the squid.conf of a
// Squid Pod in a cluster whose pod and service ranges are admitted: the
// two ranges are cut out of the denied destinations, and nothing else of
// the rules changes.
func TestAdmittedClusterRangesMatchTheGoldenFile(t *testing.T) {
	admitted := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}
	got := Config{Name: "proxy-abc", Port: 3128, Denied: DefaultDeniedDestinations(), Clients: DefaultClientCIDRs(), Admitted: admitted}.Render()
	path := filepath.Join("testdata", "admitted.golden.conf")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("squid.conf differs from %s (-update rewrites it):\n%s", path, got)
	}
	plain := Config{Name: "proxy-abc", Port: 3128, Denied: DefaultDeniedDestinations(), Clients: DefaultClientCIDRs()}.Render()
	var denied []netip.Prefix
	for _, l := range strings.Split(got, "\n") {
		if f, ok := strings.CutPrefix(l, "acl proxyfleet_denied dst "); ok {
			for _, s := range strings.Fields(f) {
				denied = append(denied, netip.MustParsePrefix(s))
			}
		} else if !strings.HasPrefix(l, "# Admitted") && !strings.Contains(plain, l+"\n") {
			t.Errorf("line %q is not in the squid.conf without admitted ranges", l)
		}
	}
	for _, a := range []string{"10.244.0.5", "10.244.255.255", "10.96.0.10", "10.111.255.255"} {
		if clustertargets.Contains(denied, netip.MustParseAddr(a)) {
			t.Errorf("admitted %s is still denied", a)
		}
	}
	for _, a := range []string{"10.0.0.1", "10.243.255.255", "10.245.0.0", "10.95.255.255", "10.112.0.0", "127.0.0.1", "169.254.169.254", "172.16.0.1", "192.168.0.1", "100.64.0.1", "fd00::1"} {
		if !clustertargets.Contains(denied, netip.MustParseAddr(a)) {
			t.Errorf("%s, outside the admitted ranges, is no longer denied", a)
		}
	}
}

func TestRenderRefusesAnAdmittedRangeThatIsNotPrivate(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "8.8.8.0/24") {
			t.Fatalf("Render admitted a public range: %v", r)
		}
	}()
	_ = Config{Name: "p", Port: 3128, Denied: DefaultDeniedDestinations(), Clients: DefaultClientCIDRs(), Admitted: []netip.Prefix{netip.MustParsePrefix("8.8.8.0/24")}}.Render()
}
