package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestTokenClientsLeaseOnlyWhatTheirLineAllows: two token clients of one
// gateway, each allowed one pool of real Squids. Each is served through
// its own pool's Squid; a selector or pin reaching only the other's pool
// is a 403 pool_forbidden naming the client and that pool, and nothing
// reaches the site; a session name both clients' crawlers chose does not
// share a member.
func TestTokenClientsLeaseOnlyWhatTheirLineAllows(t *testing.T) {
	squids := squid.StartAll(t,
		squid.Options{Name: "sq-eu", OutgoingAddr: "127.0.0.41"},
		squid.Options{Name: "sq-us", OutgoingAddr: "127.0.0.42"},
	)
	var members []pool.Member
	for i, s := range squids {
		u, err := url.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, pool.Member{Name: s.Name(), URL: u, Attributes: map[string]string{
			pool.AttributeNamespace: "fleet", pool.AttributePool: []string{"eu", "us"}[i], "region": []string{"eu", "us"}[i]}})
	}
	cs, err := clients.Parse(strings.NewReader("team-a tok-a pool=fleet/eu\nteam-b tok-b select=region=us\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, Options{AllowPrivateTargets: true, Clients: cs}, pool.StoreOptions{}, members...)
	site := testutil.StartTarget(t, testutil.TargetOptions{})
	tlsSite := testutil.StartTLSTarget(t, testutil.TargetOptions{})

	served := []struct {
		name, user, token, source string
	}{
		{"team-a through its pool's Squid", "crawler-session-s1", "tok-a", "127.0.0.41"},
		{"team-b with the same user and session through its own", "crawler-session-s1", "tok-b", "127.0.0.42"},
		{"team-a naming a selector its pool matches", "crawler-region-eu", "tok-a", "127.0.0.41"},
	}
	for _, tc := range served {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				resp, a := get(t, e.client(tc.user, tc.token), site.URL()+"/ok", nil)
				if resp.StatusCode != 200 || a.Source != tc.source {
					t.Fatalf("status %d via %q, want 200 via %s", resp.StatusCode, a.Source, tc.source)
				}
			}
		})
	}
	t.Run("team-b over CONNECT through its own Squid", func(t *testing.T) {
		u := "http://" + url.UserPassword("crawler", "tok-b").String() + "@" + e.addr
		c := testutil.MustProxyClient(t, u, tlsSite.ClientTLSConfig())
		resp, a := get(t, c, tlsSite.URL()+"/tls", nil)
		if resp.StatusCode != 200 || a.Source != "127.0.0.42" {
			t.Fatalf("status %d via %q, want 200 via 127.0.0.42", resp.StatusCode, a.Source)
		}
	})

	before := len(site.Requests())
	refused := []struct {
		name, user, token string
		hdr               http.Header
		want              []string
	}{
		{"team-a asking for the other pool's region", "crawler-region-us", "tok-a", nil,
			[]string{"client team-a may not lease pool fleet/us", "not in client team-a's allowance (pool=fleet/eu, --auth-token-file line 1"}},
		{"team-a selecting the other pool by its attributes", "crawler", "tok-a", http.Header{"X-Proxyfleet-Select": {"proxyfleet.io/pool=us"}},
			[]string{"client team-a may not lease pool fleet/us"}},
		{"team-b pinning the other pool's Squid", "crawler;proxy=sq-eu", "tok-b", nil,
			[]string{"client team-b may not lease pool fleet/eu", "(select=region=us, --auth-token-file line 2"}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, site.URL()+"/no", nil)
			for k, v := range tc.hdr {
				req.Header[k] = v
			}
			resp, err := e.client(tc.user, tc.token).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := body(t, resp)
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderReason) != "pool_forbidden" {
				t.Fatalf("status %d reason %q (%q), want 403 pool_forbidden", resp.StatusCode, resp.Header.Get(HeaderReason), b)
			}
			for _, w := range tc.want {
				if !strings.Contains(b, w) {
					t.Errorf("body %q does not say %q", b, w)
				}
			}
			if strings.Contains(b, "tok-") {
				t.Fatalf("body %q shows a token", b)
			}
		})
	}
	if n := len(site.Requests()); n != before {
		t.Fatalf("the site saw %d requests of refused clients", n-before)
	}
	t.Run("a selector matching nothing anywhere is still no_member", func(t *testing.T) {
		resp, _ := get(t, e.client("crawler-region-ap", "tok-a"), site.URL()+"/none", nil)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != "no_member" {
			t.Fatalf("status %d reason %q, want 503 no_member", resp.StatusCode, resp.Header.Get(HeaderReason))
		}
	})
}
