package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestGatewayDeadSites is a crawler following dead links through the real
// binary and three real Squids: answers about a site never take a member
// out, evidence about a member still does.
func TestGatewayDeadSites(t *testing.T) {
	bin := testutil.BuildBinary(t)

	t.Run("dead sites leave every member in service", func(t *testing.T) {
		t.Parallel()
		trio := startSquids(t, "nx", "127.0.0.71", "127.0.0.72", "127.0.0.73")
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), rotation: "per-request"})
		sendDeadSites(t, g)
		wantInService(t, g, 3)
		// The metric tells the truth about whose failure it was: the 502
		// target_unreachable answers are counted as such, none as a
		// member's upstream_failed.
		outcomes := scrapeCounter(t, g.metricsAddr, "proxyfleet_gateway_requests_total", "outcome", "")
		if outcomes["target_unreachable"] != 8 || outcomes["upstream_failed"] != 0 {
			t.Fatalf("outcomes after 8 dead-site requests: %v, want 8 target_unreachable and no upstream_failed", outcomes)
		}
		live := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.75"})
		tc := g.tunnelClient(t, "", live.ClientTLSConfig())
		for range 6 {
			mustGetOK(t, tc, live.URL()+"/after-dead-sites", nil)
		}
		if got, want := live.Sources(), outgoingAddrs(trio); !slices.Equal(got, want) {
			t.Fatalf("right after the dead sites, per-request rotation left from %v; want all three %v", got, want)
		}
	})

	t.Run("a pool-api gateway reports site answers as site answers", func(t *testing.T) {
		t.Parallel()
		trio := startSquids(t, "nxapi", "127.0.0.76", "127.0.0.77", "127.0.0.78")
		owner := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), api: true})
		remote := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolAPIArgs(t, "http://"+owner.apiAddr, owner.apiToken)})
		sendDeadSites(t, remote)
		// The pool lives in the owner: its members are all still in service.
		wantInService(t, owner, 3)
		live := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.79"})
		tc := remote.tunnelClient(t, "", live.ClientTLSConfig())
		for range 6 {
			mustGetOK(t, tc, live.URL()+"/after-dead-sites", nil)
		}
		if got, want := live.Sources(), outgoingAddrs(trio); !slices.Equal(got, want) {
			t.Fatalf("through the pool API after dead sites: sources %v, want all three %v", got, want)
		}
	})

	t.Run("a killed Squid goes out of service and comes back", func(t *testing.T) {
		t.Parallel()
		pair := startSquids(t, "nxkill", "127.0.0.81", "127.0.0.82")
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(pair), rotation: "per-request",
			args: []string{"--failure-cooldown", "3s"}})
		live := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.83"})
		tc := g.tunnelClient(t, "", live.ClientTLSConfig())
		mustGetOK(t, tc, live.URL()+"/warm", nil)
		pair[0].Kill()
		for range 3 {
			if r := mustGetOK(t, tc, live.URL()+"/killed", nil); r.source != "127.0.0.82" {
				t.Fatalf("with %s killed, a tunnel left from %s", pair[0].Name(), r.source)
			}
		}
		wantInService(t, g, 1)
		pair[0].Start()
		poll.Until(t, 60*time.Second, "the restarted member to serve the live site again", func() error {
			r, err := doGet(tc, live.URL()+"/back", nil)
			if err != nil {
				return err
			}
			if r.status != http.StatusOK || r.source != "127.0.0.81" {
				return fmt.Errorf("%d from %q, not yet through the returned Squid", r.status, r.source)
			}
			if got := scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", ""); got["true"] != 2 {
				return fmt.Errorf("members in service %v", got)
			}
			return nil
		})
	})

	t.Run("a Squid refusing every CONNECT goes out while the others serve the same sites", func(t *testing.T) {
		t.Parallel()
		squids := squid.StartAll(t,
			squid.Options{Name: "nxev-0", OutgoingAddr: "127.0.0.84"},
			squid.Options{Name: "nxev-1", OutgoingAddr: "127.0.0.85"},
			squid.Options{Name: "nxev-refusing", OutgoingAddr: "127.0.0.86", AccessFirst: []string{"http_access deny CONNECT"}},
		)
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), rotation: "per-request"})
		var sites []*testutil.Target
		for i := range 4 {
			sites = append(sites, testutil.StartTLSTarget(t, testutil.TargetOptions{Host: fmt.Sprintf("127.0.0.%d", 87+i)}))
		}
		out := false
		for i := 0; i < 40 && !out; i++ {
			site := sites[i%len(sites)]
			r := mustGetOK(t, g.tunnelClient(t, "", site.ClientTLSConfig()), site.URL()+"/evidence", nil)
			if r.source == "127.0.0.86" {
				t.Fatalf("request %d left through the refusing Squid", i)
			}
			out = scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", "")["true"] == 2
		}
		if !out {
			t.Fatalf("after 40 requests the refusing Squid is still in service: %v",
				scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", ""))
		}
		if n := scrapeCounter(t, g.metricsAddr, "proxyfleet_gateway_upstream_failures_total", "member", "")[squids[2].Addr()]; n != 1 {
			t.Errorf("upstream failures of the refusing Squid: %v, want 1 (the one member-wide verdict)", n)
		}
	})
}

// sendDeadSites sends what a crawler following dead links sends: CONNECTs to
// names that do not resolve and to a port that refuses connections, and a
// plain GET to a dead name. Each must be a 502 target_unreachable carrying
// Squid's reason.
func sendDeadSites(t *testing.T, g *gatewayProc) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.74:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	targets := []string{refused}
	for _, l := range "abcdef" {
		targets = append(targets, "nx-"+string(l)+".invalid:443")
	}
	for _, target := range targets {
		_, resp, err := testutil.ConnectTunnel(g.addr, target, nil, 60*time.Second)
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		b := readBody(t, resp)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(hdrReason) != "target_unreachable" || !strings.Contains(b, "X-Squid-Error ERR_") {
			t.Fatalf("CONNECT %s: %d %s %q; want 502 target_unreachable with Squid's reason", target, resp.StatusCode, resp.Header.Get(hdrReason), b)
		}
	}
	r := mustGet(t, g.client(t, "", nil), "http://nx-plain.invalid/", nil)
	if r.status != http.StatusBadGateway || r.reason != "target_unreachable" || !strings.Contains(r.body, "X-Squid-Error") {
		t.Fatalf("GET http://nx-plain.invalid/: %d %s %q; want 502 target_unreachable", r.status, r.reason, r.body)
	}
}

// wantInService requires proxyfleet_members to count n members in service
// now: members leave service at once, so no waiting hides a member that
// went out and came back.
func wantInService(t *testing.T, g *gatewayProc, n int) {
	t.Helper()
	if got := scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", ""); got["true"] != float64(n) {
		t.Fatalf("members in service %v, want %d", got, n)
	}
}

// readBody reads and closes a response body.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
