package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// testRecorder records what the gateway reports, for assertions.
type testRecorder struct {
	mu       sync.Mutex
	requests []string // "member outcome"
	failures map[string]int
	bytes    map[string]int64
	// handshakes counts "leg resumed" (resumed true or false).
	handshakes map[string]int
	// fallbacks counts MITMHelloFallback by reason.
	fallbacks map[string]int
}

func (r *testRecorder) MITMHelloFallback(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fallbacks == nil {
		r.fallbacks = map[string]int{}
	}
	r.fallbacks[reason]++
}

func (r *testRecorder) MITMHandshake(leg string, resumed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.handshakes == nil {
		r.handshakes = map[string]int{}
	}
	r.handshakes[leg+" "+strconv.FormatBool(resumed)]++
}

func (r *testRecorder) Request(member, outcome string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, member+" "+outcome)
}

func (r *testRecorder) UpstreamFailure(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == nil {
		r.failures = map[string]int{}
	}
	r.failures[member]++
}

func (r *testRecorder) BytesRelayed(dir string, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bytes == nil {
		r.bytes = map[string]int64{}
	}
	r.bytes[dir] += n
}

func (r *testRecorder) failuresOf(member string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures[member]
}

func (r *testRecorder) outcomes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests)
}

func (r *testRecorder) bytesOf(dir string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes[dir]
}

// env is a gateway serving on 127.0.0.1 in front of a real pool.Store.
type env struct {
	t      testing.TB
	store  *pool.Store
	gw     *Gateway
	addr   string
	rec    *testRecorder
	served chan error
}

func newEnv(t testing.TB, o Options, so pool.StoreOptions, members ...pool.Member) *env {
	t.Helper()
	store := pool.NewStore(so)
	store.SetMembers(members)
	rec := &testRecorder{}
	o.Pool = store
	if o.Quotas == nil {
		o.Quotas = store
	}
	if o.Metrics == nil {
		o.Metrics = rec
	}
	gw, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	addr, served := serveGateway(t, gw)
	return &env{t: t, store: store, gw: gw, addr: addr, rec: rec, served: served}
}

// serveGateway serves gw on a free loopback port, shut down when the test
// ends; served gets Serve's result.
func serveGateway(t testing.TB, gw *Gateway) (addr string, served chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served = make(chan error, 1)
	go func() { served <- gw.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
	})
	return ln.Addr().String(), served
}

// directMembers are n direct members d2.. bound to 127.0.0.2.., so a target
// sees which member carried a request.
func directMembers(n int) []pool.Member {
	var ms []pool.Member
	for i := 0; i < n; i++ {
		ms = append(ms, pool.Member{
			Name:       fmt.Sprintf("d%d", i+2),
			SourceAddr: netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 2)}),
		})
	}
	return ms
}

func sourceOf(m pool.Member) string { return m.SourceAddr.String() }

// client returns an HTTP client using the gateway with the given username
// and token ("" user: no credentials).
func (e *env) client(user, token string) *http.Client {
	u := "http://" + e.addr
	if user != "" || token != "" {
		u = "http://" + url.UserPassword(user, token).String() + "@" + e.addr
	}
	return testutil.MustProxyClient(e.t, u, nil)
}

func get(t *testing.T, c *http.Client, u string, hdr http.Header) (*http.Response, testutil.TargetAnswer) {
	t.Helper()
	resp, a, err := testutil.GetAnswer(c, u, hdr)
	if err != nil && resp == nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return resp, a
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNewValidatesOptions(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{name: "pool is required", o: Options{}, want: "Pool is required"},
		{name: "bad mode", o: Options{Pool: store, Mode: "sometimes"}, want: "Mode"},
		{name: "negative retries", o: Options{Pool: store, Retries: -1}, want: "Retries"},
		{name: "negative lease ttl", o: Options{Pool: store, LeaseTTL: -time.Second}, want: "LeaseTTL"},
		{name: "negative dial timeout", o: Options{Pool: store, DialTimeout: -time.Second}, want: "DialTimeout"},
		{name: "empty token", o: Options{Pool: store, Clients: []clients.Client{{Name: "a", Token: "a", All: true}, {Name: "b", All: true}}}, want: "Clients[1]"},
		{name: "negative affinity size", o: Options{Pool: store, AffinityEntries: -1}, want: "AffinityEntries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := New(tt.o)
			if err == nil {
				_ = g.Shutdown(context.Background())
				t.Fatal("New accepted invalid options")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name %q", err, tt.want)
			}
		})
	}
	g, err := New(Options{Pool: store})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	if g.leases.mode != rotation.ModeSticky || g.leases.ttl != DefaultLeaseTTL || g.path.dialTimeout != DefaultDialTimeout ||
		g.path.requestTimeout != DefaultRequestTimeout || g.path.retries != 0 {
		t.Fatalf("defaults not applied: mode %q ttl %v dial %v request %v retries %d", g.leases.mode, g.leases.ttl, g.path.dialTimeout, g.path.requestTimeout, g.path.retries)
	}
	if got := g.path.classifier.Classify(429); got != rotation.ResultRateLimited {
		t.Fatalf("default classifier reads 429 as %q", got)
	}
}

func TestPerRequestRotationSpreadsOverEveryMember(t *testing.T) {
	members := directMembers(3)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	c := e.client("", "")
	seen := map[string]string{} // source -> member header
	for i := 0; i < 12; i++ {
		resp, a := get(t, c, tg.URL()+"/x", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		seen[a.Source] = resp.Header.Get(HeaderProxy)
		if resp.Header.Get(HeaderLease) == "" {
			t.Fatal("answer has no X-Proxyfleet-Lease")
		}
	}
	for _, m := range members {
		if seen[sourceOf(m)] != m.Name {
			t.Fatalf("member %s (%s) not used or misreported; seen %v", m.Name, sourceOf(m), seen)
		}
	}
	if n := e.store.ActiveLeases(); n != 0 {
		t.Fatalf("per-request leases not released: %d active", n)
	}
}

func TestStickyKeepsOneMemberPerTargetAndSpreadsTargets(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(3)...)
	a := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	b := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.20"})
	c := e.client("crawler", "")
	for i := 0; i < 8; i++ {
		get(t, c, a.URL(), nil)
		get(t, c, b.URL(), nil)
	}
	if len(a.Sources()) != 1 || len(b.Sources()) != 1 {
		t.Fatalf("sticky rotation used several members per target: a %v, b %v", a.Sources(), b.Sources())
	}
	if a.Sources()[0] == b.Sources()[0] {
		t.Fatalf("two targets share member %s although others are free", a.Sources()[0])
	}
	// Another session of the same user gets its own member for the same
	// target (the free one: fewest active leases first).
	first := a.Sources()[0]
	resp, ans := get(t, c, a.URL(), http.Header{HeaderSession: {"other"}})
	if resp.StatusCode != 200 || ans.Source == first || ans.Source == b.Sources()[0] {
		t.Fatalf("second session went via %s; a's session has %s, b's %s", ans.Source, first, b.Sources()[0])
	}
}

func TestSessionProxyAndSelectorParameters(t *testing.T) {
	members := directMembers(3)
	members[0].Attributes = map[string]string{"region": "eu"}
	members[1].Attributes = map[string]string{"region": "us", "tier": "dc"}
	members[2].Attributes = map[string]string{"region": "us", "tier": "res"}
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	tests := []struct {
		name string
		user string
		hdr  http.Header
		want pool.Member
	}{
		{name: "proxy parameter pins a member", user: "u-proxy-d4", want: members[2]},
		{name: "selector in hyphen form", user: "u-session-s1-region-eu", want: members[0]},
		{name: "selector in semicolon form", user: "u;session=s-2;region=us;tier=dc", want: members[1]},
		{name: "selector header", user: "v", hdr: http.Header{HeaderSelect: {"tier=res"}}, want: members[2]},
		{name: "proxy header", user: "w", hdr: http.Header{HeaderProxy: {"d3"}}, want: members[1]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := e.client(tt.user, "")
			for i := 0; i < 3; i++ {
				resp, a := get(t, c, tg.URL(), tt.hdr)
				if resp.StatusCode != 200 || a.Source != sourceOf(tt.want) || resp.Header.Get(HeaderProxy) != tt.want.Name {
					t.Fatalf("status %d via %s (%s), want %s", resp.StatusCode, a.Source, resp.Header.Get(HeaderProxy), tt.want.Name)
				}
			}
		})
	}
	t.Run("a later request naming another proxy leaves the pin", func(t *testing.T) {
		c := e.client("pinned", "")
		first, _ := get(t, c, tg.URL(), nil)
		// Name a member other than the pinned one, or this proves nothing.
		other := members[0]
		if first.Header.Get(HeaderProxy) == other.Name {
			other = members[1]
		}
		before := e.store.ActiveLeases()
		resp, a := get(t, c, tg.URL(), http.Header{HeaderProxy: {other.Name}})
		if a.Source != sourceOf(other) || resp.Header.Get(HeaderProxy) != other.Name {
			t.Fatalf("proxy=%s answered via %s (pinned to %s)", other.Name, a.Source, first.Header.Get(HeaderProxy))
		}
		// The replaced pin's lease was given back, not left to its TTL.
		if after := e.store.ActiveLeases(); after != before {
			t.Fatalf("active leases %d after re-pinning, want %d (the old pin's lease released)", after, before)
		}
	})
}

func TestRateLimitCoolsMemberForThatTargetOnly(t *testing.T) {
	members := directMembers(2)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	a := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	b := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.21"})
	limited := sourceOf(members[0])
	a.SetRule(limited, http.StatusTooManyRequests, map[string]string{"Retry-After": "2"})
	c := e.client("", "")

	var got429 bool
	var limitedAt time.Time
	for i := 0; i < 4 && !got429; i++ {
		resp, ans := get(t, c, a.URL(), nil)
		if resp.StatusCode == http.StatusTooManyRequests {
			got429, limitedAt = true, time.Now()
			if ans.Source != limited || resp.Header.Get(HeaderProxy) != members[0].Name {
				t.Fatalf("429 came via %s", ans.Source)
			}
		}
	}
	if !got429 {
		t.Fatal("the rate-limited member was never used")
	}
	// Inside the window: a never goes through the limited member, b does.
	bSeen := map[string]bool{}
	for i := 0; i < 6; i++ {
		resp, ans := get(t, c, a.URL(), nil)
		if resp.StatusCode != 200 || ans.Source == limited {
			t.Fatalf("inside the Retry-After window: status %d via %s", resp.StatusCode, ans.Source)
		}
		_, bans := get(t, c, b.URL(), nil)
		bSeen[bans.Source] = true
	}
	if time.Since(limitedAt) >= 2*time.Second {
		t.Fatalf("the in-window checks took %v, longer than the window; the test proves nothing", time.Since(limitedAt))
	}
	if !bSeen[limited] {
		t.Fatalf("the limited member was not used for another target: %v", bSeen)
	}
	// After the window the member serves a again.
	a.ClearRule(limited)
	poll.Until(t, 20*time.Second, "the rate-limited member to serve the site again", func() error {
		_, ans := get(t, c, a.URL(), nil)
		if ans.Source != limited {
			return fmt.Errorf("still not via %s (got %s)", limited, ans.Source)
		}
		return nil
	})
}

func TestBanIsRetriedOnAnotherMemberForIdempotentRequests(t *testing.T) {
	members := directMembers(2)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	banned := sourceOf(members[0])
	tg.SetRule(banned, http.StatusForbidden, nil)
	c := e.client("", "")
	for i := 0; i < 4; i++ {
		resp, a := get(t, c, tg.URL(), nil)
		if resp.StatusCode != 200 || a.Source == banned || resp.Header.Get(HeaderProxy) != members[1].Name {
			t.Fatalf("GET %d: status %d via %s, want 200 via %s", i, resp.StatusCode, a.Source, members[1].Name)
		}
	}
	if n := tg.Count(banned); n != 1 {
		t.Fatalf("banned member saw %d requests; want exactly one (then its cooldown)", n)
	}

	// A POST with a body is never replayed: the ban answer reaches the client.
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.22"})
	other.SetRule(banned, http.StatusForbidden, nil)
	var got403 bool
	for i := 0; i < 4 && !got403; i++ {
		resp, err := c.Post(other.URL()+"/form", "text/plain", strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusForbidden {
			got403 = true
			if resp.Header.Get(HeaderProxy) != members[0].Name || resp.Header.Get(HeaderLease) == "" {
				t.Fatalf("403 answer misses gateway headers: %v", resp.Header)
			}
		}
	}
	if !got403 {
		t.Fatal("a banned POST was replayed instead of answered")
	}
}

func TestBanRetryStopsAtRetriesAndDeliversLastAnswer(t *testing.T) {
	members := directMembers(3)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 1, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	for _, m := range members {
		tg.SetRule(sourceOf(m), http.StatusForbidden, nil)
	}
	resp, _ := get(t, e.client("", ""), tg.URL(), nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want the site's 403", resp.StatusCode)
	}
	if tg.Total() != 2 {
		t.Fatalf("target saw %d attempts, want 2 (one try plus Retries=1)", tg.Total())
	}
}

func TestSuccessAfterABanResetsTheBanBackoff(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	const cooldown = 10 * time.Minute
	so := pool.StoreOptions{Clock: clock, Cooldown: rotation.CooldownPolicy{Default: cooldown, Max: time.Hour}}
	members := directMembers(1)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true}, so, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	target := rotation.TargetKey(strings.TrimPrefix(tg.URL(), "http://"))
	c := e.client("", "")
	banWindow := func() time.Duration {
		t.Helper()
		tg.SetRule(sourceOf(members[0]), http.StatusForbidden, nil)
		if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d, want the site's 403", resp.StatusCode)
		}
		tg.ClearRule(sourceOf(members[0]))
		until, ok := e.store.Members()[0].Cooldowns[target]
		if !ok {
			t.Fatalf("no cooldown for %s after a ban: %v", target, e.store.Members()[0].Cooldowns)
		}
		return until.Sub(clock.Now())
	}

	if w := banWindow(); w != cooldown {
		t.Fatalf("first ban: window %v, want %v", w, cooldown)
	}
	clock.Step(cooldown + time.Minute)
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the window: status %d, want 200", resp.StatusCode)
	}
	// The 200 told the pool the pair works again, so the next ban is a
	// first strike again, not a doubled window.
	if w := banWindow(); w != cooldown {
		t.Fatalf("ban after a success: window %v, want %v (the success did not reset the backoff)", w, cooldown)
	}
}

func TestUpstreamFailureIsRetriedForGETs(t *testing.T) {
	dead := deadUpstream(t)
	members := append([]pool.Member{dead}, directMembers(1)...)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	c := e.client("", "")
	for i := 0; i < 3; i++ {
		resp, a := get(t, c, tg.URL(), nil)
		if resp.StatusCode != 200 || a.Source != "127.0.0.2" {
			t.Fatalf("GET %d: status %d via %s", i, resp.StatusCode, a.Source)
		}
	}
	if e.rec.failuresOf(dead.Name) != 1 {
		t.Fatalf("upstream failures of %s = %d, want 1 (then its failure window)", dead.Name, e.rec.failuresOf(dead.Name))
	}
}

func TestNoUsableMemberIs503WithCounts(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{MaxLeasesPerMember: 1}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	if resp, _ := get(t, e.client("first", ""), tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first session: %d", resp.StatusCode)
	}
	resp, err := e.client("second", "").Get(tg.URL())
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != "no_member" {
		t.Fatalf("status %d reason %q, want 503 no_member", resp.StatusCode, resp.Header.Get(HeaderReason))
	}
	if !strings.Contains(b, "1 considered, 0 unhealthy, 0 in cooldown, 1 at capacity") {
		t.Fatalf("503 body does not give the counts: %q", b)
	}
	if !slices.Contains(e.rec.outcomes(), " no_member") {
		t.Fatalf("outcome not recorded: %v", e.rec.outcomes())
	}
}

func TestAnswerWithoutContentTypeIsRelayedWithoutOne(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // no Content-Type, and none sniffed
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte("slow down"))
	}))
	t.Cleanup(site.Close)
	resp, err := e.client("u-rotate-request", "").Get(site.URL)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); b != "slow down" {
		t.Fatalf("body %q", b)
	}
	if ct, ok := resp.Header["Content-Type"]; ok {
		t.Fatalf("client saw Content-Type %q the site never sent", ct)
	}
}

func TestNoMatch503SaysWhichParameterMatchedNothing(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(2)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	tests := []struct{ user, want string }{
		{"u;proxy=nosuch", `no member named "nosuch" (proxy parameter)`},
		{"u-region-mars-tier-dc", "no member has the attributes asked for (region=mars,tier=dc)"},
	}
	for _, tc := range tests {
		t.Run(tc.user, func(t *testing.T) {
			resp, err := e.client(tc.user, "").Get(tg.URL())
			if err != nil {
				t.Fatal(err)
			}
			b := body(t, resp)
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, tc.want) || !strings.Contains(b, "0 considered") {
				t.Fatalf("status %d body %q, want 503 saying %q with the counts", resp.StatusCode, b, tc.want)
			}
		})
	}
}

// A sessttl above the pool's maximum is a 407 whatever the session holds:
// a new session, and one whose pin the pool is not asked about (it was
// accepted silently there once).
func TestSessTTLAboveMaximumIs407(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{MaxTTL: time.Minute}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	for _, user := range []string{"u-sessttl-2h", "u-session-held", "u-session-held-sessttl-2h"} {
		resp, err := e.client(user, "").Get(tg.URL())
		if err != nil {
			t.Fatal(err)
		}
		b := body(t, resp)
		want := http.StatusProxyAuthRequired
		if user == "u-session-held" {
			want = http.StatusOK // takes the pin the next one asks on
		}
		if resp.StatusCode != want || want != http.StatusOK && !strings.Contains(b, "maximum lease TTL of 1m0s") {
			t.Fatalf("%s: status %d body %q, want %d", user, resp.StatusCode, b, want)
		}
	}
	if n := e.store.ActiveLeases(); n != 1 {
		t.Fatalf("%d leases active, want the held session's one", n)
	}
}

func TestGatewayLeaseTTLAboveThePoolMaximumIs503NotTheClientsFault(t *testing.T) {
	// The client asked for no sessttl: the TTL is the gateway's own
	// --lease-ttl, so a 407 blaming the client's parameters would mislead.
	e := newEnv(t, Options{AllowPrivateTargets: true, LeaseTTL: 2 * time.Hour}, pool.StoreOptions{MaxTTL: time.Minute}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	resp, err := e.client("u", "").Get(tg.URL())
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != "pool_error" || !strings.Contains(b, "--lease-ttl") {
		t.Fatalf("status %d reason %q body %q, want 503 pool_error naming --lease-ttl", resp.StatusCode, resp.Header.Get(HeaderReason), b)
	}
}

func TestClientAuthAndMalformedParametersAre407(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, Clients: []clients.Client{{Name: "a", Token: "tok-1", All: true}, {Name: "b", Token: "tok-2", All: true}}}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	tests := []struct {
		name, user, token string
		hdr               http.Header
		status            int
		reason, body      string
	}{
		{name: "right token passes", user: "alice", token: "tok-2", status: 200},
		{name: "no credentials", status: 407, reason: "auth", body: "proxy authentication required"},
		{name: "wrong token", user: "alice", token: "tok-3", status: 407, reason: "auth", body: "unknown token"},
		{name: "malformed username", user: "alice-session", token: "tok-1", status: 407, reason: "bad_params", body: "odd number"},
		{name: "bad sessttl", user: "alice-sessttl-x", token: "tok-1", status: 407, reason: "bad_params", body: "sessttl"},
		{name: "username and header disagree", user: "alice-session-a", token: "tok-1",
			hdr: http.Header{HeaderSession: {"b"}}, status: 407, reason: "bad_params", body: "username says"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, tg.URL(), nil)
			for k, v := range tt.hdr {
				req.Header[k] = v
			}
			resp, err := e.client(tt.user, tt.token).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := body(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d (%q)", resp.StatusCode, tt.status, b)
			}
			if tt.status != 407 {
				return
			}
			if resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxyfleet"` || resp.Header.Get(HeaderReason) != tt.reason {
				t.Fatalf("407 headers: %v", resp.Header)
			}
			if !strings.Contains(b, tt.body) {
				t.Fatalf("body %q does not say %q", b, tt.body)
			}
			if strings.Contains(b, "tok-") {
				t.Fatal("407 body echoes a token")
			}
		})
	}
	t.Run("CONNECT with a malformed username", func(t *testing.T) {
		_, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), http.Header{"Proxy-Authorization": {basic("a;x", "tok-1")}}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 407 || !strings.Contains(body(t, resp), "not key=value") {
			t.Fatalf("CONNECT status %d", resp.StatusCode)
		}
	})
	if tg.Total() != 1 {
		t.Fatalf("target saw %d requests; only the authenticated one may pass", tg.Total())
	}
}

func basic(user, token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+token))
}

func TestPrivateTargetsAreRefusedByDefault(t *testing.T) {
	res := fixedResolver{
		"internal.example": {netip.MustParseAddr("10.1.2.3")},
		"meta.example":     {netip.MustParseAddr("169.254.169.254")},
		"mixed.example":    {netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("10.9.9.9")},
		"cgnat.example":    {netip.MustParseAddr("100.64.1.1")},
		"ula.example":      {netip.MustParseAddr("fd00::1")},
	}
	e := newEnv(t, Options{Resolver: res}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	c := e.client("", "")
	tests := []struct{ url, want string }{
		{tg.URL(), "loopback"},
		{"http://internal.example/", "private"},
		{"http://meta.example/latest/meta-data", "link-local"},
		{"http://cgnat.example/", "private"},
		{"http://mixed.example/", "10.9.9.9, a private address"},
		{"http://ula.example/", "private"},
		{"http://[::1]:8080/", "loopback"},
		{"http://0.0.0.0:8080/", "unspecified"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			resp, err := c.Get(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			b := body(t, resp)
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderReason) != "private_target" || !strings.Contains(b, tt.want) {
				t.Fatalf("status %d reason %q body %q", resp.StatusCode, resp.Header.Get(HeaderReason), b)
			}
		})
	}
	t.Run("CONNECT to a loopback target", func(t *testing.T) {
		_, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("CONNECT status %d", resp.StatusCode)
		}
	})
	if tg.Total() != 0 {
		t.Fatalf("a refused target was reached %d times", tg.Total())
	}
	if n := e.store.ActiveLeases(); n != 0 {
		t.Fatalf("a refused request leased a member: %d active", n)
	}
}

func TestNeverProxiesToItself(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	resp, err := e.client("", "").Get("http://" + e.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(b, "own listen address") {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
	_, port, _ := net.SplitHostPort(e.addr)
	// Every spelling of this host that a connection would reach it by:
	// an unspecified address goes to the loopback listener.
	for _, self := range []string{e.addr, "localhost:" + port, "0.0.0.0:" + port, "[::]:" + port, "[::ffff:127.0.0.1]:" + port} {
		_, cresp, err := testutil.ConnectTunnel(e.addr, self, nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cresp.StatusCode != http.StatusLoopDetected {
			t.Errorf("CONNECT %s (itself): %d, want 508", self, cresp.StatusCode)
		}
	}
}

func TestOriginFormRequestIs400(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	resp, err := http.Get("http://" + e.addr + "/some/path")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 400 || !strings.Contains(b, "absolute URI") {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
}

func TestGatewayHeadersAreStrippedBeforeForwarding(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	req, _ := http.NewRequest(http.MethodGet, tg.URL()+"/h", nil)
	req.Header.Set(HeaderSession, "s1")
	req.Header.Set(HeaderSelect, "")
	req.Header.Del(HeaderSelect)
	req.Header.Set("X-Proxyfleet-Anything", "x")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("X-End-To-End", "kept")
	resp, err := e.client("u", "secret").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp)
	if resp.Header.Get(HeaderProxy) != "d2" || resp.Header.Get(HeaderLease) == "" {
		t.Fatalf("answer lacks gateway headers: %v", resp.Header)
	}
	reqs := tg.Requests()
	if len(reqs) != 1 {
		t.Fatalf("target saw %d requests", len(reqs))
	}
	h := reqs[0].Header
	for k := range h {
		if strings.HasPrefix(k, "X-Proxyfleet-") || k == "Proxy-Authorization" || k == "X-Hop" || k == "Proxy-Connection" {
			t.Fatalf("target saw %s: %v", k, h)
		}
	}
	if h.Get("X-End-To-End") != "kept" {
		t.Fatalf("an end-to-end header was dropped: %v", h)
	}
	if reqs[0].URI != "/h" {
		t.Fatalf("target got request URI %q, want origin form /h", reqs[0].URI)
	}
}

func TestSitesCannotForgeGatewayHeadersAndBodiesStream(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	release := make(chan struct{})
	site := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderProxy, "forged")
		w.Header().Set(HeaderReason, "forged")
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "first;")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "second")
		w.Header().Set("X-Sum", "42")
	}))
	resp, err := e.client("", "").Get(site + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get(HeaderProxy) != "d2" || resp.Header.Get(HeaderReason) != "" {
		t.Fatalf("site forged gateway headers: %v", resp.Header)
	}
	// The first chunk arrives while the site still holds the rest: streaming.
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first;" {
		t.Fatalf("first chunk %q %v", buf, err)
	}
	close(release)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "second" {
		t.Fatalf("rest %q %v", rest, err)
	}
	if resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("trailer lost: %v", resp.Trailer)
	}
}

func TestSiteBreakingOffMidBodyReachesTheClientAsAnError(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	site := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	resp, err := e.client("", "").Get(site + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("a truncated chunked answer reached the client as complete")
	}
}

// TestAMemberBreakingOffBeforeTheBodyFailsTheAttempt: a member that sends
// an answer's head and breaks off before any of its body (a Squid killed
// in the middle of an answer) fails that attempt: an idempotent request
// is served by another member, any other gets the gateway's 502 with its
// reason; never a closed connection without one byte.
func TestAMemberBreakingOffBeforeTheBodyFailsTheAttempt(t *testing.T) {
	const whole = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
	heads := []struct{ name, head string }{
		{"with a length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
	}
	ends := []struct {
		name  string
		reset bool
	}{{"reset", true}, {"closed", false}}
	for _, hd := range heads {
		for _, end := range ends {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				t.Run(hd.name+"/"+end.name+"/"+method, func(t *testing.T) {
					var asked atomic.Int64
					// Both members answer by themselves; the first request
					// either of them reads is the one broken off.
					answer := func(_ int, c net.Conn) bool {
						if asked.Add(1) > 1 {
							_, err := io.WriteString(c, whole)
							return err == nil
						}
						_, _ = io.WriteString(c, hd.head)
						if tc, ok := c.(*net.TCPConn); ok && end.reset {
							_ = tc.SetLinger(0)
						}
						return false
					}
					var ms []pool.Member
					for _, name := range []string{"m1", "m2"} {
						addr, _ := scriptedSite(t, false, answer)
						ms = append(ms, pool.Member{Name: name, URL: &url.URL{Scheme: "http", Host: addr}})
					}
					e := newEnv(t, Options{AllowPrivateTargets: true, Retries: 1}, pool.StoreOptions{}, ms...)
					var sent io.Reader
					if method == http.MethodPost {
						sent = strings.NewReader("form=1")
					}
					req, err := http.NewRequest(method, "http://127.0.0.1:9/page", sent)
					if err != nil {
						t.Fatal(err)
					}
					resp, err := e.client("", "").Do(req)
					if err != nil {
						t.Fatalf("the client got no answer: %v", err)
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						t.Fatalf("the answer's body broke off: %v", err)
					}
					// Whose it was is not known (the site or the member
					// broke it off): the pair rests, no member for every site.
					if n := restingFor(e.store, "127.0.0.1"); n != 1 {
						t.Fatalf("%d members rest for the site, want the one that broke off", n)
					}
					if n := restingFor(e.store, ""); n != 0 {
						t.Fatalf("%d members rest for every site, want none", n)
					}
					if method == http.MethodGet {
						if resp.StatusCode != http.StatusOK || string(b) != "hello" || resp.Header.Get(HeaderAttempts) != "2" {
							t.Fatalf("got %d %q after %s attempts; want 200 \"hello\" from the second member", resp.StatusCode, b, resp.Header.Get(HeaderAttempts))
						}
						return
					}
					if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != fault.ReasonTargetUnreachable || !strings.Contains(string(b), "broke off its answer after the head") {
						t.Fatalf("got %d (reason %q) %q; want the gateway's 502 target_unreachable saying what broke off", resp.StatusCode, resp.Header.Get(HeaderReason), b)
					}
					if n := asked.Load(); n != 1 {
						t.Fatalf("the POST was sent %d times; a request that is not idempotent is sent once", n)
					}
				})
			}
		}
	}
}

// startSite serves h on 127.0.0.1 and returns its base URL.
func startSite(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// deadUpstream is an http upstream member whose port refuses connections.
// Its name sorts first, so the store tries it first.
func deadUpstream(t *testing.T) pool.Member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return pool.Member{Name: "a-dead", URL: &url.URL{Scheme: "http", Host: addr}}
}

// fixedResolver answers from a map; unknown names fail.
type fixedResolver map[string][]netip.Addr

func (r fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return slices.Clone(a), nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestRequestTimeoutBoundsTheHeadNotTheBody(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, RequestTimeout: 300 * time.Millisecond}, pool.StoreOptions{}, directMembers(1)...)
	site := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-head" {
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(200)
		for i := 0; i < 3; i++ {
			_, _ = io.WriteString(w, "chunk;")
			w.(http.Flusher).Flush()
			time.Sleep(250 * time.Millisecond)
		}
	}))
	c := e.client("", "")
	resp, err := c.Get(site + "/slow-head")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(HeaderReason) != "timeout" {
		t.Fatalf("slow head: status %d body %q", resp.StatusCode, b)
	}
	resp, err = c.Get(site + "/slow-body")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); b != "chunk;chunk;chunk;" {
		t.Fatalf("a body streaming past RequestTimeout was cut: %q", b)
	}
}

// TestALeaseAPIThatRefusesTheGatewaysIdentityIsA403 pins what a crawler
// behind a sidecar whose service account lacks the lease binding sees: the
// lease API's 403 passed on as the gateway's own 403 pool_forbidden with
// the API's reason, not a 503 that reads as an outage to retry, and the
// site never reached.
func TestALeaseAPIThatRefusesTheGatewaysIdentityIsA403(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers(directMembers(2))
	refuse := reviewerFunc(func(context.Context, string) error {
		return fmt.Errorf("%w: service account crawlers/unbound has no lease binding", leaseapi.ErrTokenForbidden)
	})
	api := httptest.NewServer(leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: "api-token", Reviewer: refuse}))
	defer api.Close()
	client, err := leaseapi.NewClient(api.URL, "projected-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{Pool: client, Retries: 2, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(gln)
	defer gw.Shutdown(context.Background())
	tg := testutil.StartTarget(t, testutil.TargetOptions{})

	resp, err := testutil.MustProxyClient(t, "http://"+gln.Addr().String(), nil).Get(tg.URL())
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderReason) != fault.ReasonPoolForbidden || !strings.Contains(b, "no lease binding") {
		t.Errorf("a gateway the lease API refuses answered %d %s %q; want 403 pool_forbidden naming the API's reason", resp.StatusCode, resp.Header.Get(HeaderReason), b)
	}
	if n := tg.Total(); n != 0 {
		t.Errorf("the site was reached %d times through a gateway the pool refuses", n)
	}
}

func TestRemotePoolThroughTheLeaseAPI(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	members := directMembers(2)
	store.SetMembers(members)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := &http.Server{Handler: leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: "api-token"})}
	go api.Serve(ln)
	defer api.Close()
	client, err := leaseapi.NewClient("http://"+ln.Addr().String(), "api-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &testRecorder{}
	gw, err := New(Options{Pool: client, Retries: 2, AllowPrivateTargets: true, Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(gln)
	defer gw.Shutdown(context.Background())
	c := testutil.MustProxyClient(t, "http://"+gln.Addr().String(), nil)

	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	banned := sourceOf(members[0])
	tg.SetRule(banned, http.StatusForbidden, nil)
	for i := 0; i < 3; i++ {
		resp, a := get(t, c, tg.URL(), nil)
		if resp.StatusCode != 200 || a.Source == banned {
			t.Fatalf("GET %d: %d via %s", i, resp.StatusCode, a.Source)
		}
	}
	// The ban went to the controller's store through the API.
	var cooled bool
	for _, ms := range store.Members() {
		if ms.Name == members[0].Name {
			_, cooled = ms.Cooldowns[rotation.TargetKey(tg.Addr())]
		}
	}
	if tg.Count(banned) != 1 || !cooled {
		t.Fatalf("banned member used %d times; cooldown in the store: %v (%+v)", tg.Count(banned), cooled, store.Members())
	}
	if store.ActiveLeases() != 1 {
		t.Fatalf("the sticky session holds %d leases in the store, want 1", store.ActiveLeases())
	}

	api.Close()
	resp, err := c.Get(tg.URL() + "/?new-target")
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp) // the pinned session still works without the API
	if resp.StatusCode != 200 {
		t.Fatalf("pinned session after the API went away: %d", resp.StatusCode)
	}
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.25"})
	resp, err = c.Get(other.URL())
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get(HeaderReason) != "pool_unreachable" || !strings.Contains(b, "unreachable") {
		t.Fatalf("new target without the API: %d %q", resp.StatusCode, b)
	}
}

// reviewerFunc adapts a function to leaseapi.TokenReviewer.
type reviewerFunc func(ctx context.Context, token string) error

func (f reviewerFunc) ReviewToken(ctx context.Context, token string) (pool.Client, error) {
	return pool.Client{}, f(ctx, token)
}
