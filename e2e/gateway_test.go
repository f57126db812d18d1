package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestGateway runs the standalone gateway's acceptance scenarios against the
// real proxyfleet binary, three real Squids whose
// tcp_outgoing_address is 127.0.0.2, .3 and .4, and Go target servers that
// answer with the source address they see. Squids are stateless, so the
// scenarios share them; each scenario runs its own gateway process and its
// own targets, and they run in parallel. The crash scenario has Squids of
// its own, since it kills one.
func TestGateway(t *testing.T) {
	bin := testutil.BuildBinary(t)
	trio := startSquids(t, "trio", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	sources := outgoingAddrs(trio)
	for _, sc := range []struct {
		name string
		run  gatewayScenario
	}{
		{"per-request rotation reaches every upstream", gatewayRotatesPerRequestAcrossEveryUpstream},
		{"upstreams file reload swaps members without dropping a live tunnel", gatewayReloadsTheUpstreamsFileWithoutDroppingATunnel},
		{"sticky rotation keeps one upstream per target and spreads targets", gatewayStickyRotationKeepsOneUpstreamPerTarget},
		{"429 with Retry-After cools one upstream down for that target only", gatewayCoolsOneUpstreamDownForOneTargetOn429},
		{"a Squid killed mid-run causes no client-visible failure and comes back", gatewaySurvivesASquidKilledMidRun},
		{"CONNECT through the chain reaches an HTTPS target end to end", gatewayTunnelsToAnHTTPSTargetEndToEnd},
		{"session, proxy and attribute parameters pin; bad usernames and tokens get 407", gatewayUsernameParametersPinAndBadCredentialsGet407},
		{"no usable member gets 503 with the reason", gatewayAnswers503WhenNoMemberIsUsable},
		{"lease API and the lease CLI share the gateway's store", gatewayLeaseAPIAndCLIShareItsStore},
		{"a private target is refused by default", gatewayRefusesAPrivateTargetByDefault},
		{"SIGTERM lets an open tunnel finish within the grace period and exits 0", gatewayDrainsAnOpenTunnelOnSIGTERM},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, bin, trio, sources) })
	}
}

// gatewayScenario is one TestGateway scenario: the proxyfleet binary, the
// shared Squids (127.0.0.2, .3, .4, in that order) and their outgoing
// addresses. Each scenario runs its own gateway process and targets and
// calls t.Parallel.
type gatewayScenario func(t *testing.T, bin string, trio []*squid.Squid, sources []string)

// gatewayRotatesPerRequestAcrossEveryUpstream: per-request rotation reaches every upstream.
func gatewayRotatesPerRequestAcrossEveryUpstream(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	// A proxy in the gateway's own environment must be ignored: it points nowhere.
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), rotation: "per-request",
		env: []string{"HTTP_PROXY=http://127.0.0.1:1", "HTTPS_PROXY=http://127.0.0.1:1"}})
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.21"})
	c := g.client(t, "", nil)

	const n = 30
	seen := map[string]int{}
	for range n {
		r := mustGetOK(t, c, target.URL()+"/rotate", nil)
		seen[r.source]++
		if r.lease == "" {
			t.Fatalf("answer without %s", hdrLease)
		}
		if want := memberSource(trio, r.proxy); want != r.source {
			t.Fatalf("%s says %q, but the target saw %s (want %s)", hdrProxy, r.proxy, r.source, want)
		}
	}
	if got := keys(seen); !slices.Equal(got, sources) {
		t.Fatalf("sources %v, want every upstream %v", got, sources)
	}
	for src, k := range seen {
		if k < n/6 {
			t.Errorf("upstream %s carried %d of %d requests: per-request rotation should spread them", src, k, n)
		}
	}

	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.22"})
	tc := g.tunnelClient(t, "", tlsTarget.ClientTLSConfig())
	for range 9 {
		mustGetOK(t, tc, tlsTarget.URL()+"/tunnel", nil)
	}
	if got := tlsTarget.Sources(); !slices.Equal(got, sources) {
		t.Fatalf("new CONNECT tunnels left from %v, want every upstream %v", got, sources)
	}

	// The metrics count what each member carried.
	okByMember := scrapeCounter(t, g.metricsAddr, "proxyfleet_gateway_requests_total", "member", `outcome="ok"`)
	for _, sq := range trio {
		if want := target.Count(sq.OutgoingAddr()) + tlsTarget.Count(sq.OutgoingAddr()); okByMember[sq.Addr()] < float64(want) {
			t.Errorf("metrics count %v ok requests for %s, but it carried %d", okByMember[sq.Addr()], sq.Addr(), want)
		}
	}
}

// gatewayReloadsTheUpstreamsFileWithoutDroppingATunnel: upstreams file reload swaps members without dropping a live tunnel.
func gatewayReloadsTheUpstreamsFileWithoutDroppingATunnel(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	line := func(i int) string { return fmt.Sprintf("%s name=sq%d\n", trio[i].URL(), i+2) }
	g := startGateway(t, bin, gwConfig{upstreamsFile: line(0) + line(1), rotation: "per-request",
		args: []string{"--upstreams-reload-interval", "100ms"}})
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.23"})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.24"})
	c := g.client(t, "", nil)
	for range 4 {
		mustGetOK(t, c, target.URL()+"/before", nil)
	}
	if got, want := target.Sources(), []string{"127.0.0.2", "127.0.0.3"}; !slices.Equal(got, want) {
		t.Fatalf("before the reload: sources %v, want %v", got, want)
	}

	// A tunnel through sq3, which the reload removes.
	conn, resp, err := testutil.ConnectTunnel(g.addr, tlsTarget.Addr(), http.Header{"X-Proxyfleet-Proxy": {"sq3"}}, 10*time.Second)
	if err != nil || conn == nil {
		t.Fatalf("CONNECT pinned to sq3: %v %v", err, resp)
	}
	defer conn.Close()
	tc := tls.Client(conn, tlsTarget.ClientTLSConfig())
	br := bufio.NewReader(tc)
	if err := getOnTLS(tc, br, tlsTarget, "/before"); err != nil {
		t.Fatal(err)
	}

	// Replace the file atomically: sq3 out, sq4 in.
	path := filepath.Join(g.dir, "upstreams.txt")
	writeFile(t, path+".new", "# reloaded\n"+line(0)+line(2))
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	reloaded := time.Now()
	poll.Until(t, 20*time.Second, "requests through the added member sq4", func() error {
		mustGetOK(t, c, target.URL()+"/reload", nil)
		if !usedSince(target, "127.0.0.4", reloaded) {
			return errors.New("the added member sq4 carries no requests yet")
		}
		return nil
	})
	target.Reset()
	for range 8 {
		mustGetOK(t, c, target.URL()+"/after", nil)
	}
	if got, want := target.Sources(), []string{"127.0.0.2", "127.0.0.4"}; !slices.Equal(got, want) {
		t.Fatalf("after the reload: sources %v, want %v (sq3 removed, sq4 added)", got, want)
	}
	for i := range 3 {
		if err := getOnTLS(tc, br, tlsTarget, fmt.Sprintf("/after-%d", i)); err != nil {
			t.Fatalf("the tunnel through the removed member was dropped by the reload: %v", err)
		}
	}
	if got := tlsTarget.Sources(); !slices.Equal(got, []string{"127.0.0.3"}) {
		t.Fatalf("the pinned tunnel left from %v, want sq3's 127.0.0.3", got)
	}
}

// gatewayStickyRotationKeepsOneUpstreamPerTarget: sticky rotation keeps one upstream per target and spreads targets.
func gatewayStickyRotationKeepsOneUpstreamPerTarget(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), rotation: "sticky", args: []string{"--lease-ttl", "60s"}})
	var targets []*testutil.Target
	for i := range 6 {
		targets = append(targets, testutil.StartTarget(t, testutil.TargetOptions{Host: fmt.Sprintf("127.0.0.%d", 31+i)}))
	}
	c := g.client(t, "", nil)
	for range 6 { // interleaved, so every target's lease is live while the others are asked
		for _, tg := range targets {
			mustGetOK(t, c, tg.URL()+"/sticky", nil)
		}
	}
	used := map[string]int{}
	for _, tg := range targets {
		srcs := tg.Sources()
		if len(srcs) != 1 {
			t.Fatalf("target %s was reached from %v, want one sticky upstream", tg.Host(), srcs)
		}
		used[srcs[0]]++
	}
	// Fewest active leases first: six targets over three upstreams use all three.
	if got := keys(used); !slices.Equal(got, sources) {
		t.Fatalf("targets stuck to %v, want them spread over %v", used, sources)
	}

	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.37"})
	tc := g.tunnelClient(t, "", tlsTarget.ClientTLSConfig())
	for range 6 {
		mustGetOK(t, tc, tlsTarget.URL()+"/sticky", nil)
	}
	if got := tlsTarget.Sources(); len(got) != 1 {
		t.Fatalf("new tunnels to one HTTPS target left from %v, want one sticky upstream", got)
	}
}

// gatewayCoolsOneUpstreamDownForOneTargetOn429: 429 with Retry-After cools one upstream down for that target only.
func gatewayCoolsOneUpstreamDownForOneTargetOn429(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), rotation: "per-request"})
	limited := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.41"})
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.42"})
	banned := trio[1].OutgoingAddr()
	limited.SetRule(banned, http.StatusTooManyRequests, map[string]string{"Retry-After": "2"})
	c := g.client(t, "", nil)

	// Per-request rotation reaches the banned upstream within a few
	// requests; the gateway retries the 429 elsewhere, so the client
	// still gets 200.
	poll.Until(t, 20*time.Second, "a request through the rate-limited upstream", func() error {
		mustGetOK(t, c, limited.URL()+"/a", nil)
		if limited.Count(banned) == 0 {
			return errors.New("the rate-limited upstream was not tried yet")
		}
		return nil
	})
	// From now on a reuse would get a 200, so only the request log can tell.
	limited.ClearRule(banned)
	t0 := firstFrom(limited.Requests(), banned)

	windowEnd := t0.Add(2 * time.Second)
	for time.Now().Before(t0.Add(1500 * time.Millisecond)) {
		mustGetOK(t, c, limited.URL()+"/during", nil)
		mustGetOK(t, c, other.URL()+"/during", nil)
	}
	for _, r := range limited.Requests() {
		if r.Source == banned && r.Time.After(t0) && r.Time.Before(windowEnd.Add(-100*time.Millisecond)) {
			t.Fatalf("upstream %s used for %s %s after its 429 at %s, inside the 2s Retry-After window",
				banned, limited.Host(), r.Time.Sub(t0), t0.Format(time.StampMilli))
		}
	}
	if other.Count(banned) == 0 {
		t.Fatalf("upstream %s was not used for another target during its cooldown for %s (sources %v)",
			banned, limited.Host(), other.Counts())
	}

	poll.Until(t, 20*time.Second, "the banned upstream tried again after its cooldown", func() error {
		mustGetOK(t, c, limited.URL()+"/after", nil)
		for _, r := range limited.Requests() {
			if r.Source == banned && r.Time.After(t0) {
				return nil
			}
		}
		return fmt.Errorf("upstream %s not used again for %s since %s", banned, limited.Host(), t0.Format(time.StampMilli))
	})
}

// gatewaySurvivesASquidKilledMidRun: a Squid killed mid-run causes no client-visible failure and comes back.
func gatewaySurvivesASquidKilledMidRun(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	crashTrio := startSquids(t, "crash", "127.0.0.12", "127.0.0.13", "127.0.0.14")
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.51"})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.52"})
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.53"})
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(crashTrio), rotation: "per-request", args: []string{
		"--probe-url", probe.URL() + "/probe", "--probe-interval", "200ms", "--probe-timeout", "1s",
		"--probe-failure-threshold", "1", "--probe-success-threshold", "1",
		"--failure-cooldown", "1s", "--dial-timeout", "2s",
	}})
	victim := crashTrio[1]
	poll.Until(t, 20*time.Second, "probes from every upstream", func() error {
		if got := probe.Sources(); len(got) < 3 {
			return fmt.Errorf("probes seen from %v, want every upstream", got)
		}
		return nil
	})

	var (
		stop        atomic.Bool
		killedAt    atomic.Int64 // unix nanos; 0 until the kill
		mu          sync.Mutex
		failures    []string
		cutTunnels  int
		getsOK      atomic.Int64
		tunnelsOK   atomic.Int64
		wg          sync.WaitGroup
		tlsConf     = tlsTarget.ClientTLSConfig()
		getClient   = g.client(t, "", nil)
		victimProxy = victim.Addr()
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for range 2 {
		wg.Add(1)
		go func() { // plain GETs over keep-alive connections to the gateway
			defer wg.Done()
			for !stop.Load() {
				r, err := doGet(getClient, target.URL()+"/loop", nil)
				switch {
				case err != nil:
					fail("GET: %v", err)
				case r.status != http.StatusOK:
					fail("GET: %d %s %s", r.status, r.reason, strings.TrimSpace(r.body))
				default:
					getsOK.Add(1)
				}
			}
		}()
		wg.Add(1)
		go func() { // a new CONNECT tunnel per request
			defer wg.Done()
			for !stop.Load() {
				started := time.Now()
				proxy, err := tunnelGet(g.addr, tlsTarget, tlsConf)
				k := killedAt.Load()
				switch {
				case err == nil:
					tunnelsOK.Add(1)
				case errors.As(err, new(*tunnelError)) && proxy == victimProxy && k != 0 && started.UnixNano() < k:
					// A tunnel that was already up through the victim when it died is cut
					// with it; what must not fail is opening new ones.
					mu.Lock()
					cutTunnels++
					mu.Unlock()
				default:
					fail("CONNECT via %q: %v", proxy, err)
				}
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	poll.Until(t, 30*time.Second, "traffic through every upstream", func() error {
		return poll.Check(len(target.Sources()) == 3 && len(tlsTarget.Sources()) == 3,
			"plain via %v, TLS via %v", target.Sources(), tlsTarget.Sources())
	})

	killedAt.Store(time.Now().UnixNano())
	victim.Kill()
	gets, tunnels := getsOK.Load(), tunnelsOK.Load()
	poll.Until(t, 30*time.Second, "requests succeeding after the kill", func() error {
		return poll.Check(getsOK.Load() > gets+50 && tunnelsOK.Load() > tunnels+20,
			"%d GETs and %d tunnels since the kill", getsOK.Load()-gets, tunnelsOK.Load()-tunnels)
	})

	restarted := time.Now()
	victim.Start()
	poll.Until(t, 30*time.Second, "the restarted upstream carrying requests again", func() error {
		return poll.Check(usedSince(target, victim.OutgoingAddr(), restarted) && usedSince(tlsTarget, victim.OutgoingAddr(), restarted),
			"no plain and TLS requests via %s since the restart", victim.OutgoingAddr())
	})
	stop.Store(true)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d GETs and %d tunnels succeeded; %d tunnels that were open through the killed Squid were cut",
		getsOK.Load(), tunnelsOK.Load(), cutTunnels)
	if len(failures) > 0 {
		t.Fatalf("%d client-visible failures, first: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
}

// gatewayTunnelsToAnHTTPSTargetEndToEnd: CONNECT through the chain reaches an HTTPS target end to end.
func gatewayTunnelsToAnHTTPSTargetEndToEnd(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio)})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.61"})

	c := g.client(t, "", tlsTarget.ClientTLSConfig())
	resp, err := c.Get(tlsTarget.URL() + "/secure")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || len(resp.TLS.VerifiedChains) == 0 {
		t.Fatalf("status %s, verified TLS %v: want 200 over TLS verified against the target's own certificate", resp.Status, resp.TLS != nil)
	}
	if src := resp.Header.Get(testutil.SeenSourceHeader); !slices.Contains(sources, src) {
		t.Fatalf("target saw %q, want one of the upstreams %v", src, sources)
	}

	// The raw CONNECT answer names the upstream and the lease.
	conn, cresp, err := testutil.ConnectTunnel(g.addr, tlsTarget.Addr(), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if conn == nil {
		t.Fatalf("CONNECT answered %s", cresp.Status)
	}
	defer conn.Close()
	proxy := cresp.Header.Get(hdrProxy)
	if memberSource(trio, proxy) == "" || cresp.Header.Get(hdrLease) == "" {
		t.Fatalf("CONNECT 200 headers %v: want %s naming an upstream and %s", cresp.Header, hdrProxy, hdrLease)
	}
	src, err := getOverTunnel(conn, tlsTarget, tlsTarget.ClientTLSConfig(), "/raw")
	if err != nil {
		t.Fatal(err)
	}
	if want := memberSource(trio, proxy); src != want {
		t.Fatalf("the tunnel said %s (%s) but the target saw %s", proxy, want, src)
	}

	// The gateway does not terminate TLS: a client that does not trust
	// the target's certificate must fail the handshake.
	untrusting := g.client(t, "", &tls.Config{MinVersion: tls.VersionTLS12})
	if _, err := untrusting.Get(tlsTarget.URL() + "/secure"); err == nil {
		t.Fatal("a client without the target's CA completed TLS: the tunnel is not end to end")
	}
}

// gatewayUsernameParametersPinAndBadCredentialsGet407: session, proxy and attribute parameters pin; bad usernames and tokens get 407.
func gatewayUsernameParametersPinAndBadCredentialsGet407(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	byName := map[string]string{"sq2": trio[0].OutgoingAddr(), "sq3": trio[1].OutgoingAddr(), "sq4": trio[2].OutgoingAddr()}
	g := startGateway(t, bin, gwConfig{
		upstreamsFile: fmt.Sprintf("# e2e members\n%s name=sq2 region=eu tier=dc\n%s name=sq3 region=us tier=dc\n\n%s name=sq4 region=eu tier=res\n",
			trio[0].URL(), trio[1].URL(), trio[2].URL()),
		rotation:  "sticky",
		authToken: "s3cret-client-token",
	})
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.71"})
	url := target.URL() + "/params"

	// First, while no lease is held: selection prefers members with the
	// fewest active leases, so sticky pins taken by the later subtests
	// would otherwise decide which matching member a selector gets.
	t.Run("attribute selectors choose among matching upstreams only", func(t *testing.T) {
		for _, tc := range []struct {
			user   string
			header http.Header
			want   []string
		}{
			{"carol-region-eu-rotate-request", nil, []string{"sq2", "sq4"}},
			{"carol;region=eu;tier=res;rotate=request", nil, []string{"sq4"}},
			{"carol-rotate-request", http.Header{"X-Proxyfleet-Select": {"tier=dc"}}, []string{"sq2", "sq3"}},
		} {
			c := g.client(t, tc.user, nil)
			seen := map[string]int{}
			for range 8 {
				r := mustGetOK(t, c, url, tc.header)
				seen[r.proxy]++
				if byName[r.proxy] != r.source {
					t.Fatalf("%s: %s %q but source %s", tc.user, hdrProxy, r.proxy, r.source)
				}
			}
			if got := keys(seen); !slices.Equal(got, tc.want) {
				t.Fatalf("user %q header %v used %v, want exactly %v", tc.user, tc.header, got, tc.want)
			}
		}
	})

	t.Run("each session keeps one upstream and sessions spread", func(t *testing.T) {
		sessionSource := map[string]string{}
		for range 4 {
			for _, s := range []string{"s1", "s2", "s3"} {
				r := mustGetOK(t, g.client(t, "alice-session-"+s, nil), url, nil)
				if prev, ok := sessionSource[s]; ok && prev != r.source {
					t.Fatalf("session %s moved from %s to %s", s, prev, r.source)
				}
				sessionSource[s] = r.source
			}
		}
		distinct := map[string]int{}
		for _, src := range sessionSource {
			distinct[src]++
		}
		if len(distinct) != 3 {
			t.Fatalf("three sessions on %v, want three distinct upstreams", sessionSource)
		}
		// The header names the same session as the username parameter.
		r := mustGetOK(t, g.client(t, "alice", nil), url, http.Header{"X-Proxyfleet-Session": {"s2"}})
		if r.source != sessionSource["s2"] {
			t.Fatalf("X-Proxyfleet-Session: s2 went through %s, username session s2 through %s", r.source, sessionSource["s2"])
		}
	})

	t.Run("proxy pins one named upstream", func(t *testing.T) {
		c := g.client(t, "alice-proxy-sq3", nil)
		for range 5 {
			r := mustGetOK(t, c, url, nil)
			if r.source != byName["sq3"] || r.proxy != "sq3" {
				t.Fatalf("proxy=sq3 went through %s (%s = %q)", r.source, hdrProxy, r.proxy)
			}
		}
		r := mustGetOK(t, g.client(t, "bob", nil), url, http.Header{"X-Proxyfleet-Proxy": {"sq4"}})
		if r.source != byName["sq4"] || r.proxy != "sq4" {
			t.Fatalf("X-Proxyfleet-Proxy: sq4 went through %s (%q)", r.source, r.proxy)
		}
	})

	t.Run("gateway headers and client credentials are not forwarded", func(t *testing.T) {
		reqs := target.Requests()
		if len(reqs) == 0 {
			t.Fatal("no requests recorded")
		}
		for _, r := range reqs {
			for k := range r.Header {
				if strings.EqualFold(k, "Proxy-Authorization") || strings.HasPrefix(strings.ToLower(k), "x-proxyfleet-") {
					t.Fatalf("target received %s: %v", k, r.Header[k])
				}
			}
		}
	})

	t.Run("malformed usernames, wrong and missing tokens get 407", func(t *testing.T) {
		before := target.Total()
		for _, tc := range []struct {
			name, user, token, wantInBody string
		}{
			{"odd number of hyphen parts", "alice-session", "s3cret-client-token", "no value"},
			{"semicolon pair without =", "alice;session", "s3cret-client-token", "key=value"},
			{"wrong token", "alice", "not-the-token", ""},
			{"no credentials", "", "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := testutil.MustProxyClient(t, g.proxyURL(tc.user, tc.token), nil)
				r := mustGet(t, c, url, nil)
				if r.status != http.StatusProxyAuthRequired {
					t.Fatalf("GET: %d %s, want 407", r.status, r.body)
				}
				if tc.wantInBody != "" && !strings.Contains(r.body, tc.wantInBody) {
					t.Fatalf("407 body %q does not say what is wrong (want %q)", r.body, tc.wantInBody)
				}
				hdr := http.Header{}
				if tc.user != "" {
					hdr.Set("Proxy-Authorization", basicAuth(tc.user, tc.token))
				}
				conn, resp, err := testutil.ConnectTunnel(g.addr, target.Addr(), hdr, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if conn != nil {
					conn.Close()
					t.Fatal("CONNECT was let through")
				}
				if resp.StatusCode != http.StatusProxyAuthRequired {
					t.Fatalf("CONNECT: %s, want 407", resp.Status)
				}
			})
		}
		if got := target.Total(); got != before {
			t.Fatalf("refused requests reached the target (%d → %d)", before, got)
		}
	})
}

// gatewayAnswers503WhenNoMemberIsUsable: no usable member gets 503 with the reason.
func gatewayAnswers503WhenNoMemberIsUsable(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	t.Run("selector nobody matches", func(t *testing.T) {
		g := startGateway(t, bin, gwConfig{upstreamsFile: fmt.Sprintf("%s name=sq2 region=eu\n%s name=sq3 region=us\n", trio[0].URL(), trio[1].URL())})
		target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.72"})
		r := mustGet(t, g.client(t, "dave-region-mars", nil), target.URL(), nil)
		if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "considered") {
			t.Fatalf("%d %q, want 503 whose body gives the counts", r.status, r.body)
		}
		if target.Total() != 0 {
			t.Fatal("the target was reached")
		}
	})
	t.Run("every upstream dead", func(t *testing.T) {
		dead1, dead2 := testutil.RefusedAddr(t), testutil.RefusedAddr(t)
		g := startGateway(t, bin, gwConfig{upstreams: []string{"http://" + dead1, "http://" + dead2}, args: []string{"--failure-cooldown", "1m"}})
		target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.73"})
		c := g.client(t, "", nil)
		first := mustGet(t, c, target.URL(), nil)
		if first.status < 500 {
			t.Fatalf("first request through dead upstreams: %d, want a 5xx", first.status)
		}
		// Failure rests never empty the pool (rotation.FailureRest): at
		// most half of the members rest, and the others are tried, so the
		// answer is a member's own failure, never a 503 while a member
		// might be back.
		r := mustGet(t, c, target.URL(), nil)
		if r.status != http.StatusBadGateway || r.reason != "upstream_failed" || !strings.Contains(r.body, "connection refused") {
			t.Fatalf("%d %s %q, want 502 upstream_failed with the member's failure", r.status, r.reason, r.body)
		}
		_, resp, err := testutil.ConnectTunnel(g.addr, target.Addr(), nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(hdrReason) != "upstream_failed" {
			t.Fatalf("CONNECT: %s %s, want 502 upstream_failed", resp.Status, resp.Header.Get(hdrReason))
		}
	})
}

// gatewayLeaseAPIAndCLIShareItsStore: lease API and the lease CLI share the gateway's store.
func gatewayLeaseAPIAndCLIShareItsStore(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{
		upstreamsFile: fmt.Sprintf("%s name=sq2 region=eu\n%s name=sq3 region=us\n%s name=sq4 region=eu\n", trio[0].URL(), trio[1].URL(), trio[2].URL()),
		rotation:      "per-request",
		api:           true,
	})
	testLeaseAPI(t, g, trio)
}

// gatewayRefusesAPrivateTargetByDefault: a private target is refused by default.
func gatewayRefusesAPrivateTargetByDefault(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), refusePrivate: true})
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.91"})
	c := g.client(t, "", nil)
	for _, u := range []string{target.URL() + "/private", fmt.Sprintf("http://localhost:%d/private", target.Port())} {
		r := mustGet(t, c, u, nil)
		if r.status != http.StatusForbidden {
			t.Fatalf("GET %s: %d %q, want 403", u, r.status, r.body)
		}
	}
	conn, resp, err := testutil.ConnectTunnel(g.addr, target.Addr(), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if conn != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT to a loopback target: %s, want 403", resp.Status)
	}
	if n := target.Total(); n != 0 {
		t.Fatalf("the private target was reached %d times", n)
	}
}

// gatewayDrainsAnOpenTunnelOnSIGTERM: SIGTERM lets an open tunnel finish within the grace period and exits 0.
func gatewayDrainsAnOpenTunnelOnSIGTERM(t *testing.T, bin string, trio []*squid.Squid, sources []string) {
	t.Parallel()
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio)})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.95"})
	conn, resp, err := testutil.ConnectTunnel(g.addr, tlsTarget.Addr(), nil, 10*time.Second)
	if err != nil || conn == nil {
		t.Fatalf("CONNECT: %v %v", err, resp)
	}
	defer conn.Close()
	tc := tls.Client(conn, tlsTarget.ClientTLSConfig())
	br := bufio.NewReader(tc)
	if err := getOnTLS(tc, br, tlsTarget, "/before"); err != nil {
		t.Fatal(err)
	}
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the stopped gateway's listener to close", func() error {
		c, err := net.DialTimeout("tcp", g.addr, time.Second)
		if err != nil {
			return nil
		}
		c.Close()
		return errors.New("the gateway still accepts new connections after SIGTERM")
	})
	if g.Exited() {
		t.Fatalf("the gateway exited with a tunnel open (grace 10s): %v", g.ExitErr())
	}
	for i := range 3 {
		if err := getOnTLS(tc, br, tlsTarget, fmt.Sprintf("/draining-%d", i)); err != nil {
			t.Fatalf("the open tunnel stopped working during shutdown: %v", err)
		}
	}
	tc.Close()
	code, err := g.Wait(8 * time.Second)
	if err != nil {
		t.Fatalf("the gateway did not exit once its last tunnel closed: %v", err)
	}
	if code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// testLeaseAPI runs the lease API (and CLI) scenarios, in order, against a
// gateway with members sq2 (.2, eu), sq3 (.3, us), sq4 (.4, eu) and
// per-request rotation. They share the gateway's store: each one leaves no
// lease behind, and the cooldowns they start are on targets of their own.
func testLeaseAPI(t *testing.T, g *gatewayProc, trio []*squid.Squid) {
	la := &leaseAPIFixture{g: g, tok: g.apiToken, trio: trio}
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, la *leaseAPIFixture)
	}{
		{"bad or missing token is 401 and changes nothing", leaseAPIRefusesABadOrMissingTokenWith401},
		{"list shows every member with its attributes", leaseAPIListsEveryMemberWithItsAttributes},
		{"acquire then release, and release is idempotent", leaseAPIAcquiresAndReleasesIdempotently},
		{"TTL above the maximum is 400 and oversized body is 413", leaseAPIRefusesATooLongTTLAndAnOversizedBody},
		{"a report cools the member down for the gateway's own requests", leaseAPIReportCoolsTheMemberDownForTheGateway},
		{"409 when every member cools down, with the counts", leaseAPIAnswers409WithCountsWhenEveryMemberCools},
		{"the proxyfleet lease CLI lists, acquires and releases", leaseCLIListsAcquiresAndReleases},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, la) })
	}
}

// leaseAPIFixture is the gateway whose lease API the scenarios call, its
// API token and its Squids.
type leaseAPIFixture struct {
	g    *gatewayProc
	tok  string
	trio []*squid.Squid
}

// apiProxyInfo is one member in GET /v1/proxies.
type apiProxyInfo struct {
	Name         string            `json:"name"`
	Attributes   map[string]string `json:"attributes"`
	Healthy      bool              `json:"healthy"`
	ActiveLeases int               `json:"activeLeases"`
	Cooldowns    []struct {
		Target string `json:"target"`
	} `json:"cooldowns"`
}

// list is GET /v1/proxies by member name.
func (la *leaseAPIFixture) list(t *testing.T) map[string]apiProxyInfo {
	t.Helper()
	status, body := la.g.apiDo(t, http.MethodGet, "/v1/proxies", la.tok, nil)
	if status != http.StatusOK {
		t.Fatalf("GET /v1/proxies: %d %s", status, body)
	}
	var out struct {
		Proxies []apiProxyInfo `json:"proxies"`
		Count   int            `json:"count"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /v1/proxies: %v: %s", err, body)
	}
	m := map[string]apiProxyInfo{}
	for _, p := range out.Proxies {
		m[p.Name] = p
	}
	if out.Count != len(out.Proxies) {
		t.Fatalf("count %d but %d proxies", out.Count, len(out.Proxies))
	}
	return m
}

// activeLeases sums the members' active leases.
func (la *leaseAPIFixture) activeLeases(t *testing.T) int {
	n := 0
	for _, p := range la.list(t) {
		n += p.ActiveLeases
	}
	return n
}

// apiLease is a POST /v1/leases answer.
type apiLease struct {
	LeaseID string `json:"leaseID"`
	Proxy   struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	} `json:"proxy"`
	Target     string `json:"target"`
	TTLSeconds int64  `json:"ttlSeconds"`
}

// acquire posts body to /v1/leases and fails unless the status is want.
func (la *leaseAPIFixture) acquire(t *testing.T, body string, want int) (apiLease, []byte) {
	t.Helper()
	status, raw := la.g.apiDo(t, http.MethodPost, "/v1/leases", la.tok, []byte(body))
	if status != want {
		t.Fatalf("POST /v1/leases %s: %d %s, want %d", body, status, raw, want)
	}
	var l apiLease
	if status == http.StatusCreated {
		if err := json.Unmarshal(raw, &l); err != nil || l.LeaseID == "" {
			t.Fatalf("201 body %s: %v", raw, err)
		}
	}
	return l, raw
}

// leaseAPIRefusesABadOrMissingTokenWith401: bad or missing token is 401 and changes nothing.
func leaseAPIRefusesABadOrMissingTokenWith401(t *testing.T, la *leaseAPIFixture) {
	for _, bad := range []string{"", "wrong-token"} {
		if status, body := la.g.apiDo(t, http.MethodGet, "/v1/proxies", bad, nil); status != http.StatusUnauthorized {
			t.Fatalf("token %q: %d %s, want 401", bad, status, body)
		}
		if status, _ := la.g.apiDo(t, http.MethodPost, "/v1/leases", bad, []byte(`{"ttlSeconds":30}`)); status != http.StatusUnauthorized {
			t.Fatalf("acquire with token %q: %d, want 401", bad, status)
		}
	}
	if n := la.activeLeases(t); n != 0 {
		t.Fatalf("%d active leases after refused acquires", n)
	}
}

// leaseAPIListsEveryMemberWithItsAttributes: list shows every member with its attributes.
func leaseAPIListsEveryMemberWithItsAttributes(t *testing.T, la *leaseAPIFixture) {
	m := la.list(t)
	for name, region := range map[string]string{"sq2": "eu", "sq3": "us", "sq4": "eu"} {
		p, ok := m[name]
		if !ok || p.Attributes["region"] != region || !p.Healthy {
			t.Fatalf("member %s: %+v (present %v), want healthy with region=%s", name, p, ok, region)
		}
	}
	if len(m) != 3 {
		t.Fatalf("listed %d members, want 3", len(m))
	}
}

// leaseAPIAcquiresAndReleasesIdempotently: acquire then release, and release is idempotent.
func leaseAPIAcquiresAndReleasesIdempotently(t *testing.T, la *leaseAPIFixture) {
	l, _ := la.acquire(t, `{"selector":{"region":"eu"},"ttlSeconds":30,"target":"127.0.0.81"}`, http.StatusCreated)
	if l.Proxy.Name != "sq2" && l.Proxy.Name != "sq4" {
		t.Fatalf("selector region=eu leased %q", l.Proxy.Name)
	}
	if l.TTLSeconds != 30 || l.Target != "127.0.0.81" {
		t.Fatalf("lease %+v, want ttl 30 for 127.0.0.81", l)
	}
	if n := la.activeLeases(t); n != 1 {
		t.Fatalf("%d active leases, want 1", n)
	}
	for _, id := range []string{l.LeaseID, l.LeaseID, "no-such-lease"} {
		if status, body := la.g.apiDo(t, http.MethodDelete, "/v1/leases/"+id, la.tok, nil); status != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s, want 204", id, status, body)
		}
	}
	if n := la.activeLeases(t); n != 0 {
		t.Fatalf("%d active leases after release, want 0", n)
	}
}

// leaseAPIRefusesATooLongTTLAndAnOversizedBody: TTL above the maximum is 400 and oversized body is 413.
func leaseAPIRefusesATooLongTTLAndAnOversizedBody(t *testing.T, la *leaseAPIFixture) {
	if _, body := la.acquire(t, `{"ttlSeconds":86400,"target":"127.0.0.81"}`, http.StatusBadRequest); !strings.Contains(string(body), "ttl") {
		t.Fatalf("400 body %s does not mention the ttl", body)
	}
	huge := fmt.Sprintf(`{"target":"127.0.0.81","selector":{"pad":"%s"}}`, strings.Repeat("x", 70<<10))
	la.acquire(t, huge, http.StatusRequestEntityTooLarge)
	if n := la.activeLeases(t); n != 0 {
		t.Fatalf("%d active leases after refused acquires", n)
	}
}

// leaseAPIReportCoolsTheMemberDownForTheGateway: a report cools the member down for the gateway's own requests.
func leaseAPIReportCoolsTheMemberDownForTheGateway(t *testing.T, la *leaseAPIFixture) {
	reported := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.81"})
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.82"})
	l, _ := la.acquire(t, `{"proxy":"sq2","ttlSeconds":30,"target":"127.0.0.81"}`, http.StatusCreated)
	if l.Proxy.Name != "sq2" {
		t.Fatalf("pinned sq2, got %q", l.Proxy.Name)
	}
	status, body := la.g.apiDo(t, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", la.tok, []byte(`{"result":"rate_limited","retryAfterSeconds":120}`))
	if status/100 != 2 {
		t.Fatalf("report: %d %s", status, body)
	}
	cooling := false
	for _, cd := range la.list(t)["sq2"].Cooldowns {
		cooling = cooling || cd.Target == "127.0.0.81"
	}
	if !cooling {
		t.Fatalf("sq2 lists no cooldown for 127.0.0.81: %+v", la.list(t)["sq2"])
	}
	// Released, the lease no longer weighs on selection; the cooldown stays.
	if status, _ := la.g.apiDo(t, http.MethodDelete, "/v1/leases/"+l.LeaseID, la.tok, nil); status != http.StatusNoContent {
		t.Fatalf("release: %d", status)
	}
	c := la.g.client(t, "", nil)
	for range 9 {
		mustGetOK(t, c, reported.URL()+"/after-report", nil)
	}
	for range 9 {
		mustGetOK(t, c, other.URL()+"/after-report", nil)
	}
	if n := reported.Count(la.trio[0].OutgoingAddr()); n != 0 {
		t.Fatalf("the gateway used reported sq2 for 127.0.0.81 %d times during its cooldown (%v)", n, reported.Counts())
	}
	if len(reported.Sources()) != 2 {
		t.Fatalf("127.0.0.81 reached from %v, want the two others", reported.Sources())
	}
	if other.Count(la.trio[0].OutgoingAddr()) == 0 {
		t.Fatalf("sq2 not used for another target (%v)", other.Counts())
	}
}

// leaseAPIAnswers409WithCountsWhenEveryMemberCools: 409 when every member cools down, with the counts.
func leaseAPIAnswers409WithCountsWhenEveryMemberCools(t *testing.T, la *leaseAPIFixture) {
	for _, name := range []string{"sq2", "sq3", "sq4"} {
		l, _ := la.acquire(t, `{"proxy":"`+name+`","ttlSeconds":30,"target":"t409.example"}`, http.StatusCreated)
		status, body := la.g.apiDo(t, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", la.tok, []byte(`{"result":"banned"}`))
		if status/100 != 2 {
			t.Fatalf("report: %d %s", status, body)
		}
		la.g.apiDo(t, http.MethodDelete, "/v1/leases/"+l.LeaseID, la.tok, nil)
	}
	_, raw := la.acquire(t, `{"ttlSeconds":30,"target":"t409.example"}`, http.StatusConflict)
	var counts struct {
		Considered int `json:"considered"`
		AtCapacity int `json:"atCapacity"`
		InCooldown int `json:"inCooldown"`
		Unhealthy  int `json:"unhealthy"`
	}
	if err := json.Unmarshal(raw, &counts); err != nil {
		t.Fatalf("409 body %s: %v", raw, err)
	}
	if counts.Considered != 3 || counts.InCooldown != 3 || counts.AtCapacity != 0 || counts.Unhealthy != 0 {
		t.Fatalf("409 counts %+v (%s), want 3 considered, 3 in cooldown", counts, raw)
	}
}

// leaseCLIListsAcquiresAndReleases: the proxyfleet lease CLI lists, acquires and releases.
func leaseCLIListsAcquiresAndReleases(t *testing.T, la *leaseAPIFixture) {
	tokenFile := filepath.Join(la.g.dir, "cli-token")
	writeFile(t, tokenFile, la.tok+"\n")
	api := "http://" + la.g.apiAddr
	run := func(args ...string) (string, error) {
		cmd := exec.Command(la.g.bin, args...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("lease", "list", "--api", api, "--token-file", tokenFile)
	if err != nil {
		t.Fatalf("lease list: %v\n%s", err, out)
	}
	for _, name := range []string{"sq2", "sq3", "sq4"} {
		if !strings.Contains(out, name) {
			t.Fatalf("lease list does not show %s:\n%s", name, out)
		}
	}
	out, err = run("lease", "acquire", "--api", api, "--token-file", tokenFile, "--output", "json",
		"--proxy", "sq4", "--target", "127.0.0.83", "--ttl", "30s")
	if err != nil {
		t.Fatalf("lease acquire: %v\n%s", err, out)
	}
	var l apiLease
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.LeaseID == "" || l.Proxy.Name != "sq4" {
		t.Fatalf("lease acquire printed %q (%v), want a JSON lease on sq4", out, err)
	}
	if la.list(t)["sq4"].ActiveLeases != 1 {
		t.Fatalf("the CLI's lease is not active in the gateway's store: %+v", la.list(t)["sq4"])
	}
	for range 2 {
		if out, err := run("lease", "release", "--api", api, "--token-file", tokenFile, l.LeaseID); err != nil {
			t.Fatalf("lease release (idempotent): %v\n%s", err, out)
		}
	}
	if la.list(t)["sq4"].ActiveLeases != 0 {
		t.Fatal("the lease is still active after the CLI released it")
	}
	badFile := filepath.Join(la.g.dir, "bad-token")
	writeFile(t, badFile, "wrong\n")
	if out, err := run("lease", "list", "--api", api, "--token-file", badFile); err == nil {
		t.Fatalf("lease list with a wrong token succeeded:\n%s", out)
	}
}

// memberSource maps a member named by its default name (the Squid's
// host:port) to the source address that Squid gives its traffic.
func memberSource(squids []*squid.Squid, name string) string {
	for _, sq := range squids {
		if sq.Addr() == name {
			return sq.OutgoingAddr()
		}
	}
	return ""
}

// firstFrom is the time of the first recorded request from source.
func firstFrom(reqs []testutil.SeenRequest, source string) time.Time {
	for _, r := range reqs {
		if r.Source == source {
			return r.Time
		}
	}
	return time.Time{}
}

// usedSince reports whether target saw a request from source after since.
func usedSince(target *testutil.Target, source string, since time.Time) bool {
	for _, r := range target.Requests() {
		if r.Source == source && r.Time.After(since) {
			return true
		}
	}
	return false
}

// tunnelError is a failure after the CONNECT was answered 200: inside the tunnel.
type tunnelError struct{ err error }

func (e *tunnelError) Error() string { return "inside the tunnel: " + e.err.Error() }

// tunnelGet opens a new CONNECT tunnel through the gateway, does one HTTPS GET
// inside it and closes it. It returns the member the CONNECT 200 named.
func tunnelGet(gatewayAddr string, tlsTarget *testutil.Target, tlsConf *tls.Config) (string, error) {
	conn, resp, err := testutil.ConnectTunnel(gatewayAddr, tlsTarget.Addr(), nil, 10*time.Second)
	if err != nil {
		return "", err
	}
	if conn == nil {
		return resp.Header.Get(hdrProxy), fmt.Errorf("CONNECT answered %s", resp.Status)
	}
	defer conn.Close()
	proxy := resp.Header.Get(hdrProxy)
	if _, err := getOverTunnel(conn, tlsTarget, tlsConf, "/tunnel"); err != nil {
		return proxy, &tunnelError{err}
	}
	return proxy, nil
}

// getOverTunnel does a TLS handshake over conn and one GET; it returns the
// source address the target saw.
func getOverTunnel(conn net.Conn, tlsTarget *testutil.Target, tlsConf *tls.Config, path string) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(conn, tlsConf)
	req, _ := http.NewRequest(http.MethodGet, tlsTarget.URL()+path, nil)
	if err := req.Write(tc); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("target answered %s", resp.Status)
	}
	return resp.Header.Get(testutil.SeenSourceHeader), nil
}

// getOnTLS does one keep-alive GET on an established TLS connection.
func getOnTLS(tc *tls.Conn, br *bufio.Reader, tlsTarget *testutil.Target, path string) error {
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, tlsTarget.URL()+path, nil)
	if err := req.Write(tc); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("target answered %s", resp.Status)
	}
	return nil
}

// basicAuth is a Proxy-Authorization value.
func basicAuth(user, pass string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	req.SetBasicAuth(user, pass)
	return req.Header.Get("Authorization")
}

// scrapeCounter reads a counter from the gateway's /metrics and sums it by
// the value of label byLabel over the series whose labels contain match.
func scrapeCounter(t *testing.T, metricsAddr, name, byLabel, match string) map[string]float64 {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, match) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(name)+1:], "} ")
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		for _, kv := range strings.Split(labels, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok && k == byLabel {
				out[strings.Trim(val, `"`)] += v
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("/metrics has no %s series with %s", name, match)
	}
	return out
}
