package gateway

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestClusterTargetsAdmitTheClustersRangesAndNothingElse gives the gateway
// the node's pod and service ranges as ClusterTargets: a pod IP, a
// ClusterIP and a name resolving to one reach the upstream member, while
// every other private, loopback and link-local target stays refused.
func TestClusterTargetsAdmitTheClustersRangesAndNothingElse(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	upstream := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.String())
		mu.Unlock()
		_, _ = w.Write([]byte("from the site"))
	}))
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	res := fixedResolver{
		"site.sites.svc.cluster.local": {netip.MustParseAddr("10.96.4.7")},
		"internal.example":             {netip.MustParseAddr("10.1.2.3")},
		"half.example":                 {netip.MustParseAddr("10.244.0.9"), netip.MustParseAddr("10.1.2.3")},
	}
	e := newEnv(t, Options{Resolver: res, ClusterTargets: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("10.96.0.0/16")}},
		pool.StoreOptions{}, pool.Member{Name: "squid", URL: &url.URL{Scheme: "http", Host: u.Host}})
	c := e.client("", "")
	for _, target := range []string{"http://10.244.0.5:8000/pod", "http://10.96.0.20/service", "http://site.sites.svc.cluster.local/name"} {
		resp, err := c.Get(target)
		if err != nil {
			t.Fatal(err)
		}
		if b := body(t, resp); resp.StatusCode != http.StatusOK || b != "from the site" {
			t.Errorf("%s: status %d reason %q body %q, want the member's 200", target, resp.StatusCode, resp.Header.Get(HeaderReason), b)
		}
	}
	for _, tt := range []struct{ target, want string }{
		{"http://10.244.1.5/", "10.244.1.5, a private address"},
		{"http://10.97.0.1/", "10.97.0.1, a private address"},
		{"http://internal.example/", "10.1.2.3, a private address"},
		{"http://half.example/", "10.1.2.3, a private address"},
		{"http://192.168.1.1/", "a private address"},
		{"http://169.254.169.254/latest/meta-data", "a link-local address"},
		{"http://127.0.0.1:8080/", "a loopback address"},
	} {
		resp, err := c.Get(tt.target)
		if err != nil {
			t.Fatal(err)
		}
		if b := body(t, resp); resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderReason) != fault.ReasonPrivateTarget || !strings.Contains(b, tt.want) || !strings.Contains(b, "--cluster-target-cidrs") {
			t.Errorf("%s: status %d reason %q body %q, want 403 private_target naming %q and the flag", tt.target, resp.StatusCode, resp.Header.Get(HeaderReason), b, tt.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"http://10.244.0.5:8000/pod", "http://10.96.0.20/service", "http://site.sites.svc.cluster.local/name"}
	if strings.Join(asked, " ") != strings.Join(want, " ") {
		t.Errorf("the member was asked %v, want exactly %v", asked, want)
	}
}

func TestNewRefusesClusterTargetsOutsideThePrivateRanges(t *testing.T) {
	for _, p := range []string{"8.8.8.0/24", "127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/0"} {
		_, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{}), ClusterTargets: []netip.Prefix{netip.MustParsePrefix(p)}})
		if err == nil || !strings.Contains(err.Error(), "Options.ClusterTargets") || !strings.Contains(err.Error(), p) {
			t.Errorf("New with ClusterTargets %s: %v, want an error naming it", p, err)
		}
	}
}
