package health

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
)

// t0 is the fake clock's start; whole seconds, as status stores times.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one probe result fed to the engine and what must follow from it.
type step struct {
	advance time.Duration // fake time passing before this probe
	ok      bool
	latency time.Duration
	emit    bool // an event is expected
	healthy bool // the reported verdict after the step (when known)
	known   bool
}

func ok(latency time.Duration, emit, healthy bool) step {
	return step{advance: 10 * time.Second, ok: true, latency: latency, emit: emit, healthy: healthy, known: true}
}

func fail(emit, healthy bool) step {
	return step{advance: 10 * time.Second, ok: false, emit: emit, healthy: healthy, known: true}
}

// at sets how much fake time passes before the step.
func (s step) at(d time.Duration) step { s.advance = d; return s }

// TestRecordThresholdsAndSuppression drives the engine's record logic with a
// fake clock and checks, probe by probe, which results are status-affecting.
func TestRecordThresholdsAndSuppression(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name          string
		success, fail int32
		seed          *metav1.Condition // existing Healthy condition (leader handover)
		seedLatency   int64
		steps         []step
	}{
		{
			name: "the first probe gives the first verdict: healthy",
			fail: 3, steps: []step{ok(50*ms, true, true)},
		},
		{
			name: "the first probe gives the first verdict: unhealthy, without waiting for the failure threshold",
			fail: 3, steps: []step{fail(true, false)},
		},
		{
			name: "a healthy proxy turns unhealthy only at the failure threshold",
			fail: 3, steps: []step{ok(50*ms, true, true), fail(false, true), fail(false, true), fail(true, false), fail(false, false)},
		},
		{
			name: "a success in between restarts the failure count",
			fail: 2, steps: []step{ok(50*ms, true, true), fail(false, true), ok(50*ms, false, true), fail(false, true), fail(true, false)},
		},
		{
			name:    "an unhealthy proxy turns healthy only at the success threshold, with no latency reports before",
			success: 3, fail: 1,
			steps: []step{ok(50*ms, true, true), fail(true, false), ok(50*ms, false, false), ok(500*ms, false, false).at(2 * time.Minute), ok(50*ms, true, true)},
		},
		{
			name:    "a failure in between restarts the success count",
			success: 2, fail: 1,
			steps: []step{fail(true, false), ok(50*ms, false, false), fail(false, false), ok(50*ms, false, false), ok(50*ms, true, true)},
		},
		{
			name: "latency within max(20ms, 50%) of the reported one is not reported",
			fail: 3, steps: []step{ok(100*ms, true, true), ok(149*ms, false, true).at(2 * time.Minute), ok(51*ms, false, true).at(2 * time.Minute)},
		},
		{
			name: "a latency change over 50% is reported once the minimum interval has passed",
			fail: 3, steps: []step{ok(100*ms, true, true), ok(200*ms, true, true).at(61 * time.Second)},
		},
		{
			name: "a latency change over 50% within the minimum interval waits, then is reported",
			fail: 3, steps: []step{
				ok(100*ms, true, true),
				ok(200*ms, false, true).at(10 * time.Second),
				ok(210*ms, false, true).at(30 * time.Second),
				ok(205*ms, true, true).at(20 * time.Second),
				// The reported latency is now 205ms: 250ms is within 50%.
				ok(250*ms, false, true).at(2 * time.Minute),
			},
		},
		{
			name: "small latencies need a 20ms change: 5ms to 24ms is noise, 5ms to 30ms is not",
			fail: 3, steps: []step{ok(5*ms, true, true), ok(24*ms, false, true).at(2 * time.Minute), ok(30*ms, true, true).at(2 * time.Minute)},
		},
		{
			name: "a proxy jittering between 40ms and 61ms reports the move once, then never again",
			fail: 3, steps: []step{
				ok(40*ms, true, true), ok(61*ms, true, true).at(2 * time.Minute), ok(40*ms, false, true).at(2 * time.Minute),
				ok(61*ms, false, true).at(2 * time.Minute), ok(40*ms, false, true).at(2 * time.Minute),
			},
		},
		{
			name: "latency is not reported from a failed probe below the threshold",
			fail: 3, steps: []step{ok(50*ms, true, true), fail(false, true).at(2 * time.Minute)},
		},
		{
			name: "a seeded healthy verdict is kept: one failure does not flip it and the first success reports nothing",
			fail: 3, seed: &metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "seeded"},
			seedLatency: 40,
			steps:       []step{ok(45*ms, false, true), fail(false, true), fail(false, true), fail(true, false)},
		},
		{
			name:    "a seeded unhealthy verdict needs a full success run",
			success: 2, fail: 3,
			seed:  &metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProbeFailed, Message: "refused"},
			steps: []step{ok(45*ms, false, false), ok(45*ms, true, true)},
		},
		{
			name: "a seeded verdict's latency is compared with the latency in status",
			fail: 3, seed: &metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded},
			seedLatency: 40,
			steps:       []step{ok(400*ms, true, true).at(2 * time.Minute)},
		},
		{
			name: "an Unknown condition seeds nothing: the first probe is the first verdict",
			fail: 3, seed: &metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: "Whatever"},
			steps: []step{fail(true, false)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			p := gen.Proxy("px", gen.SetProxyNamespace("ns"))
			p.Spec.HealthCheck = v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", SuccessThreshold: tc.success, FailureThreshold: tc.fail}
			if tc.seed != nil {
				p.Status.Conditions = []metav1.Condition{*tc.seed}
				p.Status.LatencyMillis = tc.seedLatency
				checked := metav1.NewTime(t0.Add(-time.Hour))
				p.Status.LastHealthCheckTime = &checked
			}
			e := newTestEngine(t, clk, &listReader{items: []v1alpha1.Proxy{*p}})
			jobs := make(chan job, 1)
			e.tick(context.Background(), clk.Now(), jobs)
			st := e.states[keyOf(p)]
			if st == nil {
				t.Fatal("tick created no state")
			}
			if tc.seed != nil && (tc.seed.Status == metav1.ConditionUnknown) == st.rep.Known {
				t.Fatalf("seeded Known = %v from a %s condition", st.rep.Known, tc.seed.Status)
			}
			drain(e)
			for i, s := range tc.steps {
				clk.Step(s.advance)
				r := result{ok: s.ok, latency: s.latency, at: clk.Now()}
				if !s.ok {
					r.err = errors.New("connection refused")
				}
				e.record(job{key: keyOf(p), st: st, addr: "127.0.0.1:3128", target: mustURL(t, "http://127.0.0.1:1/"), expect: 200}, r)
				got := len(drain(e)) == 1
				v, _ := e.Snapshot(keyOf(p))
				if got != s.emit {
					t.Fatalf("step %d (ok=%v latency=%s): event = %v, want %v; reported %+v", i, s.ok, s.latency, got, s.emit, v)
				}
				if v.Known != s.known || v.Healthy != s.healthy {
					t.Fatalf("step %d: reported known=%v healthy=%v, want known=%v healthy=%v", i, v.Known, v.Healthy, s.known, s.healthy)
				}
				if s.emit {
					if !v.CheckedAt.Equal(clk.Now().Truncate(time.Second)) {
						t.Errorf("step %d: CheckedAt %s, want the probe's time %s", i, v.CheckedAt, clk.Now())
					}
					if v.Healthy && v.Latency != s.latency {
						t.Errorf("step %d: reported latency %s, want %s", i, v.Latency, s.latency)
					}
					if !v.Healthy && (v.Latency != 0 || v.Message != "connection refused") {
						t.Errorf("step %d: unhealthy verdict latency %s message %q, want 0 and the probe error", i, v.Latency, v.Message)
					}
				}
			}
		})
	}
}

// TestDroppedEventRetriesOnTheNextProbe fills the event channel so a flip's
// event is dropped: the reported verdict must not move, and the next probe
// must emit it again.
func TestDroppedEventRetriesOnTheNextProbe(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := gen.Proxy("px", gen.SetProxyNamespace("ns"))
	p.Spec.HealthCheck = v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", FailureThreshold: 1}
	e := newTestEngine(t, clk, &listReader{items: []v1alpha1.Proxy{*p}})
	e.tick(context.Background(), clk.Now(), make(chan job, 1))
	st := e.states[keyOf(p)]
	j := job{key: keyOf(p), st: st, addr: "127.0.0.1:3128", target: mustURL(t, "http://127.0.0.1:1/"), expect: 200}

	e.record(j, result{ok: true, latency: 10 * time.Millisecond, at: clk.Now()})
	drain(e)
	for range EventBuffer {
		if !e.emit(types.NamespacedName{Name: "filler"}) {
			t.Fatal("could not fill the event channel")
		}
	}
	clk.Step(10 * time.Second)
	e.record(j, result{ok: false, err: errors.New("refused"), at: clk.Now()})
	if v, _ := e.Snapshot(keyOf(p)); !v.Healthy {
		t.Fatalf("the reported verdict moved although its event was dropped: %+v", v)
	}
	drain(e)
	clk.Step(10 * time.Second)
	e.record(j, result{ok: false, err: errors.New("refused again"), at: clk.Now()})
	if evs := drain(e); len(evs) != 1 || evs[0] != keyOf(p) {
		t.Fatalf("events after the retry: %v, want one for %s", evs, keyOf(p))
	}
	if v, _ := e.Snapshot(keyOf(p)); v.Healthy || v.Message != "refused again" || !v.CheckedAt.Equal(clk.Now()) {
		t.Fatalf("reported %+v, want unhealthy with the retried probe's message and time", v)
	}
}

// TestTickSchedulesSeedsAndPrunes checks the ticker loop's bookkeeping with a
// fake clock: never-probed proxies go at once, seeded ones after a jitter
// within the interval, busy workers defer a probe to the next tick, and
// proxies that lose their address, are being deleted or are gone are pruned
// with their metric series.
func TestTickSchedulesSeedsAndPrunes(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fresh := gen.Proxy("fresh", gen.SetProxyNamespace("ns"))
	fresh.Spec.HealthCheck = v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", IntervalSeconds: 10}
	seeded := gen.Proxy("seeded", gen.SetProxyNamespace("ns"), gen.SetProxyEndpoint("127.0.0.2", 3128))
	seeded.Spec.HealthCheck = v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", IntervalSeconds: 10}
	seeded.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded}}
	noAddr := gen.Proxy("no-addr", gen.SetProxyNamespace("ns"), gen.SetProxyManaged("p"))
	reader := &listReader{items: []v1alpha1.Proxy{*fresh, *seeded, *noAddr}}
	e := newTestEngine(t, clk, reader)
	jitter := 7 * time.Second
	e.jitter = func(d time.Duration) time.Duration {
		if d != 10*time.Second {
			t.Errorf("jitter asked for a spread of %s, want the interval 10s", d)
		}
		return jitter
	}
	rec := &recordingMetrics{}
	e.o.Metrics = rec

	jobs := make(chan job, 4)
	e.tick(context.Background(), clk.Now(), jobs)
	if got := jobNames(jobs); fmt.Sprint(got) != "[fresh]" {
		t.Fatalf("first tick dispatched %v, want only the never-probed proxy", got)
	}
	if _, ok := e.Snapshot(keyOf(noAddr)); ok {
		t.Error("a proxy without an address has state")
	}
	if v, ok := e.Snapshot(keyOf(seeded)); !ok || !v.Known || !v.Healthy {
		t.Errorf("seeded proxy reported %+v, %v; want the verdict from its condition", v, ok)
	}

	clk.Step(jitter - time.Second)
	e.tick(context.Background(), clk.Now(), jobs)
	if got := jobNames(jobs); len(got) != 0 {
		t.Fatalf("tick before the jitter dispatched %v (fresh is in flight, seeded not due)", got)
	}
	clk.Step(time.Second)
	saturated := make(chan job) // no worker waiting
	e.tick(context.Background(), clk.Now(), saturated)
	e.tick(context.Background(), clk.Now(), jobs)
	if got := jobNames(jobs); fmt.Sprint(got) != "[seeded]" {
		t.Fatalf("after the jitter and a saturated tick dispatched %v, want the seeded proxy once", got)
	}

	// The in-flight fresh probe finishes; its next probe is an interval
	// after its dispatch.
	e.record(job{key: keyOf(fresh), st: e.states[keyOf(fresh)], addr: "127.0.0.1:3128", target: mustURL(t, "http://127.0.0.1:1/"), expect: 200},
		result{ok: true, latency: time.Millisecond, at: t0})
	if rec.observed[keyOf(fresh).String()] != 1 {
		t.Errorf("probe metrics %v, want one observation of %s", rec.observed, keyOf(fresh))
	}
	clk.SetTime(t0.Add(10 * time.Second))
	e.tick(context.Background(), clk.Now(), jobs)
	if got := jobNames(jobs); fmt.Sprint(got) != "[fresh]" {
		t.Fatalf("an interval after its first probe dispatched %v, want fresh", got)
	}

	// fresh is being deleted, seeded lost its address: both pruned, and the
	// late result of fresh's in-flight probe is ignored.
	freshState := e.states[keyOf(fresh)]
	deleting := *fresh
	now := metav1.NewTime(clk.Now())
	deleting.DeletionTimestamp = &now
	seededNoHost := *seeded
	seededNoHost.Spec.Endpoint = nil
	reader.set(deleting, seededNoHost)
	e.tick(context.Background(), clk.Now(), jobs)
	for _, p := range []*v1alpha1.Proxy{fresh, seeded} {
		if _, ok := e.Snapshot(keyOf(p)); ok {
			t.Errorf("%s still has state after losing its address or being deleted", p.Name)
		}
		if !rec.forgotten[keyOf(p).String()] {
			t.Errorf("%s's metric series were not forgotten", p.Name)
		}
	}
	e.record(job{key: keyOf(fresh), st: freshState, addr: "127.0.0.1:3128", target: mustURL(t, "http://127.0.0.1:1/"), expect: 200},
		result{ok: true, latency: time.Millisecond, at: clk.Now()})
	if _, ok := e.Snapshot(keyOf(fresh)); ok || rec.series(keyOf(fresh).String()) {
		t.Errorf("a pruned proxy's late probe result was recorded (state %v, series %v)", ok, rec.series(keyOf(fresh).String()))
	}

	// Gone from the list entirely: pruned too.
	reader.set(*fresh)
	e.tick(context.Background(), clk.Now(), jobs)
	jobNames(jobs)
	reader.set()
	e.tick(context.Background(), clk.Now(), jobs)
	if len(e.states) != 0 {
		t.Errorf("states left after every Proxy is gone: %d", len(e.states))
	}
}

// TestTickAddressChangeAndNoProbeURL covers the cases where the verdict in
// status no longer applies: the address changed, or no probe URL is
// configured. The engine reports Known=false and asks the reconciler once to
// drop the stale condition; a failed list changes nothing.
func TestTickAddressChangeAndNoProbeURL(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	healthyCond := []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded}}
	unprobed := gen.Proxy("unprobed", gen.SetProxyNamespace("ns"))
	unprobed.Status.Conditions = healthyCond
	moving := gen.Proxy("moving", gen.SetProxyNamespace("ns"))
	moving.Spec.HealthCheck.URL = "http://127.0.0.1:1/"
	moving.Status.Conditions = healthyCond
	reader := &listReader{items: []v1alpha1.Proxy{*unprobed, *moving}}
	e := newTestEngine(t, clk, reader)
	jobs := make(chan job, 4)

	e.tick(context.Background(), clk.Now(), jobs)
	if v, ok := e.Snapshot(keyOf(unprobed)); !ok || v.Known {
		t.Errorf("a proxy without a probe URL reported %+v, %v; want tracked without a verdict", v, ok)
	}
	if evs := drain(e); fmt.Sprint(evs) != "[ns/unprobed]" {
		t.Errorf("events %v, want one asking to drop unprobed's stale condition", evs)
	}
	e.tick(context.Background(), clk.Now(), jobs)
	if evs := drain(e); len(evs) != 0 {
		t.Errorf("the stale-condition event was repeated: %v", evs)
	}
	if got := jobNames(jobs); len(got) != 0 {
		t.Errorf("dispatched %v; the seeded proxy waits for its jitter and the unprobed one is never probed", got)
	}

	moved := *moving
	moved.Spec.Endpoint = &v1alpha1.Endpoint{Host: "127.0.0.9", Port: 3128}
	reader.set(*unprobed, moved)
	e.tick(context.Background(), clk.Now(), jobs)
	if v, ok := e.Snapshot(keyOf(moving)); !ok || v.Known {
		t.Errorf("after an address change reported %+v, %v; want no verdict until the new address is probed", v, ok)
	}
	if evs := drain(e); fmt.Sprint(evs) != "[ns/moving]" {
		t.Errorf("events %v, want one for the moved proxy", evs)
	}
	if got := jobNames(jobs); fmt.Sprint(got) != "[moving]" {
		t.Errorf("dispatched %v, want the moved proxy probed at once", got)
	}

	reader.setErr(errors.New("cache not synced"))
	e.tick(context.Background(), clk.Now(), jobs)
	if len(e.states) != 2 {
		t.Errorf("a failed list pruned states: %d left", len(e.states))
	}
}

// TestNewValidatesOptions checks the constructor's errors and defaults.
func TestNewValidatesOptions(t *testing.T) {
	r := &listReader{}
	tests := []struct {
		name    string
		o       Options
		wantErr string
	}{
		{name: "a reader is required", o: Options{}, wantErr: "Reader is required"},
		{name: "negative durations are refused", o: Options{Reader: r, Tick: -time.Second}, wantErr: "must not be negative"},
		{name: "a default probe URL must be http or https", o: Options{Reader: r, DefaultProbeURL: "ftp://example.org/"}, wantErr: "want an http:// or https:// URL"},
		{name: "a default probe URL needs a host", o: Options{Reader: r, DefaultProbeURL: "http:///path"}, wantErr: "no host"},
		{name: "credentials in a bad URL are not echoed", o: Options{Reader: r, DefaultProbeURL: "ftp://user:secret@example.org/"}, wantErr: "ftp://user:xxxxx@example.org/"},
		{name: "credentials in an unparsable URL are not echoed", o: Options{Reader: r, DefaultProbeURL: "http://user:secret@example.org:port/"}, wantErr: "not a URL: http://user:xxxxx@example.org:port/"},
		{name: "zero values take the defaults", o: Options{Reader: r, DefaultProbeURL: "https://example.org/"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if e.o.Tick != DefaultTick || e.o.Workers != DefaultWorkers || e.o.MinReportInterval != DefaultMinReportInterval || e.o.Clock == nil {
				t.Errorf("defaults not applied: %+v", e.o)
			}
			if !e.NeedLeaderElection() {
				t.Error("the engine must run on the leader only")
			}
		})
	}
}

// --- helpers ---

func newTestEngine(t *testing.T, clk *clocktesting.FakeClock, r client.Reader) *Engine {
	t.Helper()
	e, err := New(Options{Reader: r, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func keyOf(p *v1alpha1.Proxy) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// drain empties the event channel and returns the keys it held.
func drain(e *Engine) []types.NamespacedName {
	var out []types.NamespacedName
	for {
		select {
		case ev := <-e.events:
			out = append(out, client.ObjectKeyFromObject(ev.Object))
		default:
			return out
		}
	}
}

// jobNames empties jobs and returns the proxy names in it.
func jobNames(jobs chan job) []string {
	var out []string
	for {
		select {
		case j := <-jobs:
			out = append(out, j.key.Name)
		default:
			return out
		}
	}
}

// listReader is a client.Reader test double over a fixed list of Proxies.
type listReader struct {
	mu    sync.Mutex
	items []v1alpha1.Proxy
	err   error
}

func (r *listReader) set(items ...v1alpha1.Proxy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items, r.err = items, nil
}

func (r *listReader) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *listReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("listReader: Get is not used by the engine")
}

func (r *listReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	pl, ok := list.(*v1alpha1.ProxyList)
	if !ok {
		return fmt.Errorf("listReader: unexpected list %T", list)
	}
	pl.Items = nil
	for i := range r.items {
		pl.Items = append(pl.Items, *r.items[i].DeepCopy())
	}
	return nil
}

// recordingMetrics is a ProbeMetrics test double that remembers calls.
type recordingMetrics struct {
	mu        sync.Mutex
	observed  map[string]int
	failures  map[string]int
	forgotten map[string]bool
}

func (m *recordingMetrics) ObserveProbe(proxy string, _ time.Duration, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.observed == nil {
		m.observed, m.failures = map[string]int{}, map[string]int{}
	}
	m.observed[proxy]++
	if !ok {
		m.failures[proxy]++
	}
	delete(m.forgotten, proxy)
}

func (m *recordingMetrics) Forget(proxy string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgotten == nil {
		m.forgotten = map[string]bool{}
	}
	m.forgotten[proxy] = true
	delete(m.observed, proxy)
	delete(m.failures, proxy)
}

// series reports whether proxy currently has series (observed, not forgotten).
func (m *recordingMetrics) series(proxy string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.observed[proxy] > 0 && !m.forgotten[proxy]
}
