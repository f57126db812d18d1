package pool

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// healthLog is a HealthSink that remembers every verdict it was given.
type healthLog struct {
	mu    sync.Mutex
	last  map[string]healthCall
	calls int
}

type healthCall struct {
	healthy bool
	latency time.Duration
}

func (h *healthLog) SetHealth(name string, healthy bool, latency time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]healthCall{}
	}
	h.last[name] = healthCall{healthy, latency}
	h.calls++
}

func (h *healthLog) get(name string) (healthCall, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.last[name]
	return c, ok
}

// probeRecorder counts observed probes and forgotten members.
type probeRecorder struct {
	mu        sync.Mutex
	observed  map[string]int
	failures  map[string]int
	forgotten []string
}

func (r *probeRecorder) ObserveProbe(member string, d time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.observed == nil {
		r.observed, r.failures = map[string]int{}, map[string]int{}
	}
	r.observed[member]++
	if !ok {
		r.failures[member]++
	}
}

func (r *probeRecorder) ForgetProbe(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgotten = append(r.forgotten, member)
}

// switchTarget is a probe target whose answer the test switches.
type switchTarget struct {
	status atomic.Int32
	delay  atomic.Int64
	hits   atomic.Int32
	srv    *httptest.Server
}

func startSwitchTarget(t *testing.T) *switchTarget {
	t.Helper()
	st := &switchTarget{}
	st.status.Store(http.StatusOK)
	st.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.hits.Add(1)
		if d := time.Duration(st.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
			}
		}
		if st.status.Load() == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(int(st.status.Load()))
	}))
	t.Cleanup(st.srv.Close)
	return st
}

func staticMembers(ms ...Member) func() []Member {
	return func() []Member { return ms }
}

func mustProber(t *testing.T, members func() []Member, sink HealthSink, o ProberOptions) *Prober {
	t.Helper()
	p, err := NewProber(members, sink, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewProberValidates(t *testing.T) {
	sink := &healthLog{}
	ms := staticMembers()
	tests := []struct {
		name string
		o    ProberOptions
		want string
	}{
		{"missing URL", ProberOptions{}, "probe URL"},
		{"relative URL", ProberOptions{URL: "/health"}, "probe URL"},
		{"unsupported scheme", ProberOptions{URL: "ftp://127.0.0.1/"}, "probe URL"},
		{"a refused URL's password is masked", ProberOptions{URL: "ftp://u:hunter2@127.0.0.1/"}, `"ftp://u:xxxxx@127.0.0.1/"`},
		{"negative threshold", ProberOptions{URL: "http://127.0.0.1/", FailureThreshold: -1}, "negative"},
		{"bad expected status", ProberOptions{URL: "http://127.0.0.1/", ExpectedStatus: []int{42}}, "42"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewProber(ms, sink, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewProber error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestProberThresholds(t *testing.T) {
	target := startSwitchTarget(t)
	direct := DirectMember()
	sink := &healthLog{}
	p := mustProber(t, staticMembers(direct), sink, ProberOptions{
		URL: target.srv.URL, Timeout: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 3,
	})
	ctx := context.Background()
	// Each step: the target's answer, then the verdict after one round.
	steps := []struct {
		name   string
		status int32
		want   bool
	}{
		{"first probe failing sets unhealthy at once", 500, false},
		{"one success is below the success threshold", 200, false},
		{"second success flips to healthy", 200, true},
		{"one failure keeps healthy", 503, true},
		{"two failures keep healthy", 503, true},
		{"a success resets the failure run", 200, true},
		{"failure 1 of a new run", 500, true},
		{"failure 2", 500, true},
		{"third consecutive failure flips to unhealthy", 500, false},
		{"success 1 of 2", 204, false},
		{"a failure resets the success run", 500, false},
		{"success 1 of 2 again", 200, false},
		{"success 2 flips back", 200, true},
	}
	for i, st := range steps {
		target.status.Store(st.status)
		p.ProbeAll(ctx)
		got, ok := sink.get("direct")
		if !ok || got.healthy != st.want {
			t.Fatalf("step %d (%s): healthy = %v (reported %v), want %v", i, st.name, got.healthy, ok, st.want)
		}
		if h, known := p.Healthy("direct"); !known || h != st.want {
			t.Fatalf("step %d: Prober.Healthy = %v,%v", i, h, known)
		}
	}
	if got, _ := sink.get("direct"); got.latency <= 0 {
		t.Errorf("latency after successes = %v, want > 0", got.latency)
	}
	if n := target.hits.Load(); n != int32(len(steps)) {
		t.Errorf("target saw %d probes, want %d", n, len(steps))
	}
}

func TestProberFirstSuccessIsHealthyAtOnce(t *testing.T) {
	target := startSwitchTarget(t)
	sink := &healthLog{}
	p := mustProber(t, staticMembers(DirectMember()), sink, ProberOptions{URL: target.srv.URL, SuccessThreshold: 5})
	p.ProbeAll(context.Background())
	if got, _ := sink.get("direct"); !got.healthy {
		t.Error("first successful probe did not set healthy")
	}
}

func TestProberSuccessCriteria(t *testing.T) {
	tests := []struct {
		name     string
		status   int32
		expected []int
		delay    time.Duration
		want     bool
	}{
		{"2xx by default", 204, nil, 0, true},
		{"redirect is not followed and fails by default", 302, nil, 0, false},
		{"expected list accepts its status", 302, []int{302}, 0, true},
		{"expected list rejects others", 200, []int{204}, 0, false},
		{"server error fails", 500, nil, 0, false},
		{"slower than the timeout fails", 200, nil, 2 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target := startSwitchTarget(t)
			target.status.Store(tc.status)
			target.delay.Store(int64(tc.delay))
			sink := &healthLog{}
			p := mustProber(t, staticMembers(DirectMember()), sink, ProberOptions{
				URL: target.srv.URL, ExpectedStatus: tc.expected, Timeout: 300 * time.Millisecond, FailureThreshold: 1,
			})
			p.ProbeAll(context.Background())
			if got, _ := sink.get("direct"); got.healthy != tc.want {
				t.Errorf("healthy = %v, want %v", got.healthy, tc.want)
			}
		})
	}
}

func TestProberDirectMemberUsesItsSourceAddressAndIgnoresProxyEnv(t *testing.T) {
	// Any proxy from the environment would break the probe: it must dial
	// directly from the member's source address.
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("http_proxy", "http://127.0.0.1:1")
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	egress, err := EgressMember("127.0.0.3")
	if err != nil {
		t.Fatal(err)
	}
	sink := &healthLog{}
	p := mustProber(t, staticMembers(egress), sink, ProberOptions{URL: target.URL() + "/probe"})
	p.ProbeAll(context.Background())
	if got, _ := sink.get(egress.Name); !got.healthy {
		t.Fatalf("egress member unhealthy; target saw %v", target.Counts())
	}
	if n := target.Count("127.0.0.3"); n != 1 {
		t.Errorf("target saw %d probes from 127.0.0.3 (all: %v), want 1", n, target.Counts())
	}
}

func TestProberThroughRealSquid(t *testing.T) {
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	sq := squid.Start(t, squid.Options{Name: "probe", OutgoingAddr: "127.0.0.2"})
	up, err := ParseUpstream(sq.URL())
	if err != nil {
		t.Fatal(err)
	}
	dead, err := ParseUpstream("http://user:" + secret + "@" + closedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	dead.Name = "dead"
	store := NewStore(StoreOptions{})
	store.SetMembers([]Member{up, dead})
	rec := &probeRecorder{}
	var logs strings.Builder
	var logMu sync.Mutex
	p := mustProber(t, staticMembers(up, dead), store, ProberOptions{
		URL: target.URL() + "/probe", Timeout: 5 * time.Second, FailureThreshold: 2, Recorder: rec,
		Logger: newTestLogger(&logs, &logMu),
	})
	ctx := context.Background()
	p.ProbeAll(ctx)

	byName := func() map[string]MemberStatus {
		out := map[string]MemberStatus{}
		for _, st := range store.Members() {
			out[st.Name] = st
		}
		return out
	}
	st := byName()
	if !st[up.Name].Healthy || st[up.Name].Latency <= 0 {
		t.Errorf("squid member = %+v, want healthy with a latency", st[up.Name])
	}
	if st["dead"].Healthy {
		t.Error("member pointing at a closed port is healthy")
	}
	// The probe went through Squid: the target saw Squid's outgoing address.
	if n := target.Count("127.0.0.2"); n != 1 {
		t.Errorf("target saw %d requests from squid's 127.0.0.2 (all: %v), want 1", n, target.Counts())
	}
	// Only healthy members are offered.
	if l := mustAcquire(t, store, AcquireRequest{}); l.Member.Name != up.Name {
		t.Errorf("leased %s, want the healthy squid member", l.Member.Name)
	}

	// Squid goes away: healthy until FailureThreshold consecutive failures.
	sq.Stop()
	p.ProbeAll(ctx)
	if !byName()[up.Name].Healthy {
		t.Error("one failed probe flipped the verdict below the failure threshold")
	}
	p.ProbeAll(ctx)
	if byName()[up.Name].Healthy {
		t.Error("two failed probes did not flip the verdict")
	}
	// Squid comes back: one success (threshold 1) makes it healthy again.
	sq.Start()
	p.ProbeAll(ctx)
	if !byName()[up.Name].Healthy {
		t.Error("member not healthy again after squid restarted")
	}

	rec.mu.Lock()
	if rec.observed[up.Name] != 4 || rec.failures[up.Name] != 2 || rec.observed["dead"] != 4 || rec.failures["dead"] != 4 {
		t.Errorf("recorder saw %v probes, %v failures", rec.observed, rec.failures)
	}
	rec.mu.Unlock()
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), secret) {
		t.Errorf("logs leak the member password:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "member=dead") {
		t.Errorf("no verdict logged for the dead member:\n%s", logs.String())
	}
}

func TestProberPrunesRemovedMembersAndResetsChangedEndpoints(t *testing.T) {
	target := startSwitchTarget(t)
	var mu sync.Mutex
	a, _ := EgressMember("127.0.0.1")
	a.Name = "a"
	b := DirectMember()
	current := []Member{a, b}
	members := func() []Member {
		mu.Lock()
		defer mu.Unlock()
		return append([]Member(nil), current...)
	}
	rec := &probeRecorder{}
	sink := &healthLog{}
	p := mustProber(t, members, sink, ProberOptions{URL: target.srv.URL, FailureThreshold: 3, Recorder: rec})
	ctx := context.Background()
	p.ProbeAll(ctx)
	if _, known := p.Healthy("direct"); !known {
		t.Fatal("no verdict for direct")
	}

	mu.Lock()
	current = []Member{a}
	mu.Unlock()
	p.ProbeAll(ctx)
	if _, known := p.Healthy("direct"); known {
		t.Error("state of a removed member was kept")
	}
	rec.mu.Lock()
	if len(rec.forgotten) != 1 || rec.forgotten[0] != "direct" {
		t.Errorf("forgotten = %v, want [direct]", rec.forgotten)
	}
	rec.mu.Unlock()

	// "a" is healthy; its endpoint changes to an address nothing answers
	// from, and the first probe of the new endpoint decides at once instead
	// of waiting for three failures.
	target.status.Store(http.StatusOK)
	mu.Lock()
	moved := a
	moved.SourceAddr = netip.MustParseAddr("192.0.2.1") // not on this host: bind fails
	current = []Member{moved}
	mu.Unlock()
	p.ProbeAll(ctx)
	if h, _ := p.Healthy("a"); h {
		t.Error("a member whose endpoint changed kept the old verdict")
	}
}

func TestProberRunLoopsUntilCancelled(t *testing.T) {
	target := startSwitchTarget(t)
	sink := &healthLog{}
	p := mustProber(t, staticMembers(DirectMember()), sink, ProberOptions{URL: target.srv.URL, Interval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	poll.Until(t, 20*time.Second, "three probes", func() error {
		if n := target.hits.Load(); n < 3 {
			return fmt.Errorf("%d probes so far", n)
		}
		return nil
	})
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// lockedWriter serialises writes from concurrent probes into one builder.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func newTestLogger(b *strings.Builder, mu *sync.Mutex) *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{mu: mu, b: b}, nil))
}

func TestProberHTTPSProbeTunnelsThroughRealSquid(t *testing.T) {
	target := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	sq := squid.Start(t, squid.Options{Name: "probetls", OutgoingAddr: "127.0.0.4"})
	up, err := ParseUpstream(sq.URL())
	if err != nil {
		t.Fatal(err)
	}
	sink := &healthLog{}
	p := mustProber(t, staticMembers(up), sink, ProberOptions{
		URL: target.URL() + "/probe", TLSConfig: target.ClientTLSConfig(),
	})
	for round := range 2 {
		p.ProbeAll(context.Background())
		if got, _ := sink.get(up.Name); !got.healthy {
			t.Fatalf("round %d: https probe through squid failed", round)
		}
	}
	if n := target.Count("127.0.0.4"); n != 2 {
		t.Errorf("TLS target saw %d requests from squid's 127.0.0.4 (all: %v), want 2", n, target.Counts())
	}

	// Without the target's CA the TLS handshake inside the tunnel fails.
	strict := mustProber(t, staticMembers(up), sink, ProberOptions{URL: target.URL() + "/probe"})
	strict.ProbeAll(context.Background())
	if got, _ := sink.get(up.Name); got.healthy {
		t.Error("probe with an unverifiable certificate counted as healthy")
	}
}

// TestProberPassingProbeEndsFailureRest: a member resting for its own
// failures comes back at its first passing probe, before its window ends
// and whatever the success threshold; a failing probe leaves it resting.
func TestProberPassingProbeEndsFailureRest(t *testing.T) {
	target := startSwitchTarget(t)
	s := NewStore(StoreOptions{FailureWindow: time.Hour})
	s.SetMembers([]Member{DirectMember()})
	p := mustProber(t, staticMembers(DirectMember()), s, ProberOptions{URL: target.srv.URL, SuccessThreshold: 3})
	ctx := context.Background()
	l, err := s.Acquire(ctx, AcquireRequest{Target: "a.example"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Report(ctx, l.ID, Report{Result: "upstream_failed"}); err != nil {
		t.Fatal(err)
	}
	resting := func() bool { return !s.Members()[0].Cooldowns[""].IsZero() }
	target.status.Store(http.StatusServiceUnavailable)
	p.ProbeAll(ctx)
	if !resting() {
		t.Fatal("a failing probe ended the failure rest")
	}
	target.status.Store(http.StatusOK)
	p.ProbeAll(ctx)
	if resting() {
		t.Fatal("a passing probe did not end the failure rest")
	}
}
