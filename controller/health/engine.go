// Package health is the health engine: a leader-elected manager Runnable that
// probes every Proxy through the proxy itself, keeps per-Proxy health state
// (consecutive successes and failures, the verdict after the thresholds) and
// tells the Proxy reconciler when something status-affecting happened.
//
// The engine owns health *state*; the reconciler owns its *representation* in
// status. The engine never writes a Proxy: it sends an event on Events (which
// the reconciler watches through a channel source) and the reconciler reads
// Snapshot and stages the Healthy condition, status.latencyMillis and
// status.lastHealthCheckTime. One writer of status means phase (derived from
// provisioning and health together) cannot race, and writing only on a
// transition falls out for free: events are emitted only on the first
// verdict, on a threshold flip, and on a large latency change at most once
// per MinReportInterval while healthy.
//
// It imports api/v1alpha1, probe, controller/credentials and internal/redact;
// never the reconcilers (they read its verdicts through controller's small
// interface), pool or gateway.
package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/internal/redact"
)

// Defaults of Options: a probe every 10s with a 5s timeout, one success to
// turn healthy and three failures to turn unhealthy, so one lost packet never
// takes a Proxy out.
const (
	// DefaultTick is how often the engine looks for due probes.
	DefaultTick = time.Second
	// DefaultWorkers is how many probes run at once.
	DefaultWorkers = 8
	// DefaultMinReportInterval rate-limits latency-only reports of a healthy
	// proxy, so a jittery proxy cannot write status every interval.
	DefaultMinReportInterval = 60 * time.Second
	// EventBuffer is the capacity of the Events channel; a full channel drops
	// the event and the next probe retries it.
	EventBuffer = 64
	// DispatchQueue is how many due probes may wait for a free worker. A
	// tick hands every due probe over up to this many, so a fleet coming up
	// at once (a thousand new Proxies) is probed as fast as the workers go,
	// not Workers per tick; a probe still waiting is not due again.
	DispatchQueue = 4096
)

// ProbeMetrics records every probe, status-affecting or not (status writes
// are transition-only; metrics carry the high-frequency signal). The metrics
// package's HealthChecks satisfies it structurally.
type ProbeMetrics interface {
	// ObserveProbe records one probe through proxy ("namespace/name"): its
	// duration, and whether it succeeded.
	ObserveProbe(proxy string, d time.Duration, ok bool)
	// Forget deletes the proxy's series; called when its state is pruned.
	Forget(proxy string)
}

// Options configure an Engine. Zero values take the defaults.
type Options struct {
	// Reader lists Proxies; the manager's cache (mgr.GetCache()), so ticks
	// cost no API calls. Required.
	Reader client.Reader
	// Credentials reads the credentials Secrets (the controller's
	// credentials cache), so probes log in as the gateways will. Nil means
	// Reader reads them too.
	Credentials client.Reader
	// Tick is how often the engine lists Proxies and dispatches due probes
	// (default 1s). A probe is never more punctual than one tick.
	Tick time.Duration
	// Workers bounds concurrent probes (default 8). When all are busy, due
	// probes queue (up to DispatchQueue) for the next free one.
	Workers int
	// DefaultProbeURL is probed for a Proxy whose spec.healthCheck.url is
	// empty. With neither, the Proxy is not probed and has no verdict.
	DefaultProbeURL string
	// MinReportInterval is the least time between two latency-only reports of
	// a healthy proxy (default 60s). Verdict changes are never delayed.
	MinReportInterval time.Duration
	// Clock is the time source (default the real clock); tests inject a fake.
	Clock clock.WithTicker
	// Metrics, when set, records every probe.
	Metrics ProbeMetrics
	// TLSConfig verifies https probe URLs (nil: the system roots). Tests use
	// it to trust an in-test target.
	TLSConfig *tls.Config
	// Logger receives verdict changes and dropped events.
	Logger logr.Logger
}

// Verdict is the engine's reported view of one Proxy: what the reconciler
// copies into status. It changes only when an event is emitted, so a
// reconcile for any other reason writes nothing new.
type Verdict struct {
	// Known is false while the engine tracks the Proxy but has no verdict
	// for its current address (never probed yet, no probe URL configured, or
	// the address changed): the Healthy condition is then removed.
	Known bool
	// Healthy is the verdict after the thresholds.
	Healthy bool
	// Message says why: the answer of a good probe, the error of a bad one.
	Message string
	// Latency is the round-trip time of the reported probe; zero when
	// unhealthy.
	Latency time.Duration
	// CheckedAt is when the reported (status-affecting) probe ran, truncated
	// to the second as status stores it.
	CheckedAt time.Time
}

// Engine probes Proxies and keeps their health state. Create it with New and
// add it to the manager; it runs only on the leader.
type Engine struct {
	o      Options
	target *url.URL // parsed DefaultProbeURL, nil when unset
	events chan event.GenericEvent
	jitter func(time.Duration) time.Duration

	mu     sync.Mutex
	states map[types.NamespacedName]*state
}

var (
	_ manager.Runnable               = (*Engine)(nil)
	_ manager.LeaderElectionRunnable = (*Engine)(nil)
)

// New validates o, fills in the defaults and returns an engine ready to be
// added to a manager.
func New(o Options) (*Engine, error) {
	if o.Reader == nil {
		return nil, errors.New("health engine: Options.Reader is required")
	}
	if o.Tick < 0 || o.MinReportInterval < 0 || o.Workers < 0 {
		return nil, fmt.Errorf("health engine: tick %s, workers %d and min report interval %s must not be negative",
			o.Tick, o.Workers, o.MinReportInterval)
	}
	if o.Tick == 0 {
		o.Tick = DefaultTick
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.MinReportInterval == 0 {
		o.MinReportInterval = DefaultMinReportInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Credentials == nil {
		o.Credentials = o.Reader
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	e := &Engine{
		o:      o,
		events: make(chan event.GenericEvent, EventBuffer),
		jitter: func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return rand.N(d)
		},
		states: map[types.NamespacedName]*state{},
	}
	if o.DefaultProbeURL != "" {
		u, err := ParseProbeURL(o.DefaultProbeURL)
		if err != nil {
			return nil, fmt.Errorf("health engine: default probe URL: %w", err)
		}
		e.target = u
	}
	return e, nil
}

// ParseProbeURL accepts an absolute http:// or https:// URL with a host, the
// only probe targets the engine can fetch through a proxy.
func ParseProbeURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("not a URL: " + redact.URL(s))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%s: want an http:// or https:// URL", redact.Parsed(u))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%s: the URL has no host", redact.Parsed(u))
	}
	return u, nil
}

// NeedLeaderElection is true: only the leader probes, so one replica decides
// every verdict.
func (e *Engine) NeedLeaderElection() bool { return true }

// Events is the channel the reconciler watches (source.Channel): one event
// per status-affecting change, carrying only the Proxy's namespace and name.
func (e *Engine) Events() <-chan event.GenericEvent { return e.events }

// Snapshot returns the reported verdict for key. ok is false when the engine
// does not track the Proxy (not started, not the leader yet, no address): the
// caller should then leave status as it is.
func (e *Engine) Snapshot(key types.NamespacedName) (v Verdict, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.states[key]
	if !ok {
		return Verdict{}, false
	}
	return st.rep, true
}

// job is one probe handed to a worker.
type job struct {
	key   types.NamespacedName
	st    *state // the state the result belongs to; a replaced state drops it
	addr  string
	proxy *url.URL // addr with scheme and login; nil when loginErr is set
	// loginErr says why the Proxy's login could not be read: the probe then
	// fails with it, without touching the network.
	loginErr error
	target   *url.URL
	timeout  time.Duration
	expect   int
}

// Start runs Workers probe goroutines and the ticker loop until ctx ends.
func (e *Engine) Start(ctx context.Context) error {
	log := e.o.Logger
	log.Info("health engine starting", "tick", e.o.Tick, "workers", e.o.Workers,
		"defaultProbeURL", redact.Parsed(e.target), "minReportInterval", e.o.MinReportInterval)
	jobs := make(chan job, max(e.o.Workers, DispatchQueue))
	var wg sync.WaitGroup
	for range e.o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.work(ctx, jobs)
		}()
	}
	ticker := e.o.Clock.NewTicker(e.o.Tick)
	defer func() {
		ticker.Stop()
		wg.Wait()
	}()
	e.tick(ctx, e.o.Clock.Now(), jobs)
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-ticker.C():
			e.tick(ctx, now, jobs)
		}
	}
}

// work runs probes until ctx ends.
func (e *Engine) work(ctx context.Context, jobs <-chan job) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-jobs:
			start := e.o.Clock.Now()
			err := j.loginErr
			if err == nil {
				err = probeThrough(ctx, j.proxy, j.target, j.expect, j.timeout, e.o.TLSConfig)
			}
			if ctx.Err() != nil {
				return // shutting down: the error says nothing about the proxy
			}
			e.record(j, result{ok: err == nil, err: err, latency: e.o.Clock.Since(start), at: start})
		}
	}
}

// tick lists the Proxies, creates, updates and prunes their states, and
// dispatches the probes that are due. A failed list changes nothing.
func (e *Engine) tick(ctx context.Context, now time.Time, jobs chan<- job) {
	var list v1alpha1.ProxyList
	if err := e.o.Reader.List(ctx, &list); err != nil {
		if ctx.Err() == nil {
			e.o.Logger.Error(err, "health engine: listing Proxies; skipping this tick")
		}
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := make(map[types.NamespacedName]bool, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		addr := p.Address()
		if addr == "" || !p.DeletionTimestamp.IsZero() {
			continue // not seen: its state is pruned below
		}
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		seen[key] = true
		target := e.probeTarget(p)
		st := e.states[key]
		switch {
		case st == nil:
			// Unknown so far: after a leader change the verdict in status is
			// the best knowledge there is, so it seeds the state.
			st = newState(p, addr, target != nil, now, true, e.jitter)
			e.states[key] = st
		case st.addr != addr || st.probed != (target != nil):
			// A different address (or probing switched on or off) is a
			// different proxy as far as health goes: start from nothing.
			st = newState(p, addr, target != nil, now, false, e.jitter)
			e.states[key] = st
		}
		st.hc = p.Spec.HealthCheck.WithDefaults()
		if !st.rep.Known && !st.clearSent && hasHealthyCondition(p) {
			// Status still shows a verdict that no longer applies (address
			// changed, probing switched off): ask the reconciler to drop it.
			if e.emit(key) {
				st.clearSent = true
			}
		}
		if target == nil || st.inFlight || now.Before(st.next) {
			continue
		}
		j := job{key: key, st: st, addr: addr, target: target,
			timeout: st.hc.Timeout(), expect: int(st.hc.ExpectedStatus)}
		// The login is read at every dispatch, from the credentials cache:
		// a rotated Secret is used by the next probe.
		j.proxy, j.loginErr = credentials.ProxyURL(ctx, e.o.Credentials, p)
		if j.loginErr == nil && j.proxy == nil {
			j.loginErr = fmt.Errorf("%s has no address", key)
		}
		select {
		case jobs <- j:
			st.inFlight = true
			st.next = now.Add(st.hc.Interval())
		default:
			// The queue is full: the probe stays due for the next tick.
		}
	}
	for key := range e.states {
		if !seen[key] {
			e.prune(key)
		}
	}
}

// prune forgets a Proxy's state and metric series: deleted, being deleted, or
// without an address. A replacement instance starts with fresh counters.
// Called with e.mu held, so an in-flight probe's result cannot recreate the
// series afterwards (record checks the state under the same lock).
func (e *Engine) prune(key types.NamespacedName) {
	delete(e.states, key)
	if e.o.Metrics != nil {
		e.o.Metrics.Forget(key.String())
	}
	e.o.Logger.V(1).Info("health state pruned", "proxy", key.String())
}

// probeTarget is the URL to probe p with: spec.healthCheck.url, else the
// default probe URL; nil when neither is set (or the spec URL is unusable).
func (e *Engine) probeTarget(p *v1alpha1.Proxy) *url.URL {
	if s := p.Spec.HealthCheck.URL; s != "" {
		u, err := ParseProbeURL(s)
		if err != nil {
			// The CRD admits only http(s) URLs; anything else is not probed.
			return nil
		}
		return u
	}
	return e.target
}

// record applies one probe result under the lock: metrics always, the
// counters and verdict, and an event when the result is status-affecting.
func (e *Engine) record(j job, r result) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.states[j.key]
	if !ok || st != j.st {
		return // pruned or replaced while the probe ran
	}
	st.inFlight = false
	if e.o.Metrics != nil {
		e.o.Metrics.ObserveProbe(j.key.String(), r.latency, r.ok)
	}
	r.msg = describe(j, r)
	v, emit := st.observe(r, e.o.MinReportInterval)
	if !emit {
		return
	}
	if !e.emit(j.key) {
		// The reported markers stay where they were, so the next probe
		// emits again.
		e.o.Logger.Info("health event dropped: the reconciler is behind; the next probe retries", "proxy", j.key.String())
		return
	}
	if !st.rep.Known || st.rep.Healthy != v.Healthy {
		e.o.Logger.Info("health verdict", "proxy", j.key.String(), "healthy", v.Healthy,
			"message", v.Message, "latency", v.Latency)
	}
	st.report(v, r.at)
}

// emit sends a non-blocking event for key; false when the channel is full.
func (e *Engine) emit(key types.NamespacedName) bool {
	ev := event.GenericEvent{Object: &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
	select {
	case e.events <- ev:
		return true
	default:
		return false
	}
}

// describe is the Healthy condition's message for a probe result. URLs are
// redacted: a probe URL may carry credentials.
func describe(j job, r result) string {
	if r.ok {
		return fmt.Sprintf("GET %s through %s answered %d", redact.Parsed(j.target), j.addr, j.expect)
	}
	return r.err.Error()
}

// hasHealthyCondition reports whether status carries a True or False Healthy
// condition.
func hasHealthyCondition(p *v1alpha1.Proxy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
	return c != nil && c.Status != metav1.ConditionUnknown
}
