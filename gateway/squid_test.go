package gateway

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestChainsThroughRealSquids runs plain HTTP and CONNECT through real Squid
// upstreams, each with its own tcp_outgoing_address, so the target tells
// which Squid carried a request.
func TestChainsThroughRealSquids(t *testing.T) {
	squids := squid.StartAll(t,
		squid.Options{Name: "sq-a", OutgoingAddr: "127.0.0.31"},
		squid.Options{Name: "sq-b", OutgoingAddr: "127.0.0.32"},
	)
	var members []pool.Member
	for _, s := range squids {
		u, err := url.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, pool.Member{Name: s.Name(), URL: u})
	}
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	plain := testutil.StartTarget(t, testutil.TargetOptions{})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{})

	t.Run("plain HTTP rotates over both Squids", func(t *testing.T) {
		c := e.client("", "")
		seen := map[string]string{}
		for i := 0; i < 6; i++ {
			resp, a := get(t, c, plain.URL()+"/p", http.Header{"X-Proxyfleet-Session": {"x"}})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			seen[a.Source] = resp.Header.Get(HeaderProxy)
		}
		if seen["127.0.0.31"] != "sq-a" || seen["127.0.0.32"] != "sq-b" {
			t.Fatalf("sources and members seen: %v", seen)
		}
		for _, r := range plain.Requests() {
			for k := range r.Header {
				if k == "X-Proxyfleet-Session" || k == "Proxy-Authorization" {
					t.Fatalf("target saw %s through Squid", k)
				}
			}
		}
	})

	t.Run("CONNECT to an HTTPS target through each Squid", func(t *testing.T) {
		c := testutil.MustProxyClient(t, "http://"+e.addr, tlsTarget.ClientTLSConfig())
		c.Transport.(*http.Transport).DisableKeepAlives = true
		seen := map[string]bool{}
		for i := 0; i < 4; i++ {
			resp, a := get(t, c, tlsTarget.URL()+"/s", nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			seen[a.Source] = true
		}
		if !seen["127.0.0.31"] || !seen["127.0.0.32"] {
			t.Fatalf("HTTPS sources seen: %v", seen)
		}
	})

	t.Run("a killed Squid costs the client nothing", func(t *testing.T) {
		squids[0].Kill()
		c := e.client("", "")
		tc := testutil.MustProxyClient(t, "http://"+e.addr, tlsTarget.ClientTLSConfig())
		tc.Transport.(*http.Transport).DisableKeepAlives = true
		for i := 0; i < 4; i++ {
			if resp, a := get(t, c, plain.URL()+"/k", nil); resp.StatusCode != 200 || a.Source != "127.0.0.32" {
				t.Fatalf("GET after the kill: %d via %s", resp.StatusCode, a.Source)
			}
			if resp, a := get(t, tc, tlsTarget.URL()+"/k", nil); resp.StatusCode != 200 || a.Source != "127.0.0.32" {
				t.Fatalf("CONNECT after the kill: %d via %s", resp.StatusCode, a.Source)
			}
		}
		if e.rec.failuresOf("sq-a") == 0 {
			t.Fatal("the killed Squid was never counted as failed")
		}
	})
}
