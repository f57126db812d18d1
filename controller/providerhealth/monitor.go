// Package providerhealth answers "can this cluster reach each provider's
// backend right now?" without waiting for a Proxy to fail. The Monitor is a
// leader-only manager.Runnable: at start and then every interval it runs
// every configured provider's Check concurrently under one timeout, keeps the
// latest results for the scrape-time gauges, logs targets going down or
// coming back, and publishes one cluster-scoped ProviderHealth object per
// provider.
//
// It is deliberately not wired to /readyz: a dead hypervisor must not make the
// controller unready while the other providers keep working.
//
// It imports api/v1alpha1 and providers only; never the reconcilers or a
// provider implementation.
package providerhealth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

const (
	// DefaultInterval is the time between check rounds.
	DefaultInterval = time.Minute
	// MinInterval is the shortest interval the controller's flags accept:
	// every round writes one status per provider, since lastCheckTime moves.
	MinInterval = 10 * time.Second
	// DefaultTimeout bounds one round when the interval is longer.
	DefaultTimeout = 15 * time.Second
	// abandonGrace is how long a round waits past its timeout for checks
	// that have not returned before reporting them as timed out.
	abandonGrace = time.Second
	// fallbackTarget names the one target of a provider that timed out
	// before it ever reported its targets.
	fallbackTarget = "check"
)

// effectiveTimeout is the round timeout for interval and a configured
// timeout: timeout when positive, else DefaultTimeout or the interval if
// that is shorter.
func effectiveTimeout(interval, timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	if interval > 0 && interval < DefaultTimeout {
		return interval
	}
	return DefaultTimeout
}

// CheckersFrom collects the Checker of every provider that has one, looking
// through decorators (providers.Unwrapper) to the innermost provider, so a
// check never counts as a provider request in the decorators' metrics.
func CheckersFrom(provs map[string]providers.Provider) map[string]providers.Checker {
	out := map[string]providers.Checker{}
	for name, p := range provs {
		for {
			u, ok := p.(providers.Unwrapper)
			if !ok {
				break
			}
			p = u.Unwrap()
		}
		if c, ok := p.(providers.Checker); ok {
			out[name] = c
		}
	}
	return out
}

// Options configure New.
type Options struct {
	// Checkers are the providers to check, by entry name. Collect them with
	// CheckersFrom so checks bypass the metrics decorator.
	Checkers map[string]providers.Checker
	// Types maps entry names to provider types, for status.type and logs.
	Types map[string]string
	// Client writes ProviderHealth objects (create, status patch, delete).
	// Required.
	Client client.Client
	// APIReader reads ProviderHealth objects straight from the API server
	// (mgr.GetAPIReader()): they are cluster-scoped, and a cached read would
	// start a cluster-wide informer even with a namespace-restricted cache.
	// Nil means Client.
	APIReader client.Reader
	// Interval is the time between rounds; zero turns checks off (Start then
	// only deletes every ProviderHealth object it manages). The controller's
	// flags enforce MinInterval; the Monitor accepts shorter ones for tests.
	Interval time.Duration
	// Timeout bounds one round; zero means effectiveTimeout's default.
	Timeout time.Duration
	// Clock is the time source for ticks, timestamps, check durations and
	// the abandon timer of a round; nil means the real clock. (A check's
	// own context deadline is real time: contexts know no other clock.)
	Clock clock.WithTicker
	// Logger receives transitions and write failures.
	Logger logr.Logger
}

// Monitor checks the configured providers and publishes the verdicts. Build
// it with New, then add it to the manager.
type Monitor struct {
	o Options

	mu sync.Mutex
	// latest is the last result per provider, read by the gauges.
	latest map[string]Result
	// running marks providers whose check has not returned yet.
	running map[string]bool
	// noObject are the providers whose name is not a valid object name.
	noObject map[string]bool
}

// New checks o and fills its defaults; an unusable option is an error
// naming it, before anything is added to a manager.
func New(o Options) (*Monitor, error) {
	if o.Client == nil {
		return nil, errors.New("provider health monitor: Options.Client is required")
	}
	if o.Interval < 0 || o.Timeout < 0 {
		return nil, fmt.Errorf("provider health monitor: Options.Interval (%s) and Options.Timeout (%s) must not be negative", o.Interval, o.Timeout)
	}
	if o.APIReader == nil {
		o.APIReader = o.Client
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return &Monitor{o: o, running: map[string]bool{}}, nil
}

var (
	_ manager.Runnable               = (*Monitor)(nil)
	_ manager.LeaderElectionRunnable = (*Monitor)(nil)
)

// NeedLeaderElection is true: one replica checks and writes.
func (m *Monitor) NeedLeaderElection() bool { return true }

// Start deletes the ProviderHealth objects of providers that are not checked
// (all of them when checks are off), then runs a round at once and one every
// Interval until ctx ends.
func (m *Monitor) Start(ctx context.Context) error {
	m.findInvalidNames()
	m.deleteStale(ctx)
	if m.o.Interval == 0 {
		m.o.Logger.Info("provider health checks are off")
		return nil
	}
	m.o.Logger.Info("provider health monitor started", "interval", m.o.Interval,
		"timeout", effectiveTimeout(m.o.Interval, m.o.Timeout), "providers", len(m.o.Checkers))
	ticker := m.o.Clock.NewTicker(m.o.Interval)
	defer ticker.Stop()
	m.round(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
			m.round(ctx)
		}
	}
}

// Snapshot returns the latest result of every checked provider, sorted by
// provider name; empty before the first round and on non-leaders.
func (m *Monitor) Snapshot() []Result {
	m.mu.Lock()
	out := make([]Result, 0, len(m.latest))
	for _, r := range m.latest {
		r.Targets = append([]providers.TargetStatus(nil), r.Targets...)
		out = append(out, r)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Provider < out[j].Provider })
	return out
}

// EachTarget calls fn for every target of the latest round, in provider and
// target order. It is what the metrics package's scrape-time collector
// reads, so that package needs no import of this one.
func (m *Monitor) EachTarget(fn func(provider, target string, up bool, duration time.Duration, checkedAt time.Time)) {
	for _, r := range m.Snapshot() {
		for _, t := range r.Targets {
			fn(r.Provider, t.Target, t.Ready, r.Duration, r.CheckedAt)
		}
	}
}

// round is one check of every provider, then the logs, the snapshot and
// the objects.
func (m *Monitor) round(ctx context.Context) {
	results := m.check(ctx)
	if ctx.Err() != nil {
		return
	}
	m.record(results)
	for _, r := range results {
		if m.noObject[r.Provider] {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, m.o.Interval)
		err := m.publish(wctx, r)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.o.Logger.Error(err, "writing ProviderHealth failed; the next round retries", "provider", r.Provider)
		}
	}
}

// outcome is what one check goroutine reports.
type outcome struct {
	name     string
	targets  []providers.TargetStatus
	duration time.Duration
	at       time.Time
}

// check runs every Checker concurrently under one timeout. A check that has
// not returned shortly after the timeout is abandoned and reported as timed
// out; while it is still running, later rounds report it timed out at once
// instead of piling up goroutines.
func (m *Monitor) check(ctx context.Context) []Result {
	timeout := effectiveTimeout(m.o.Interval, m.o.Timeout)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	clk := m.o.Clock
	names := slices.Sorted(maps.Keys(m.o.Checkers))
	done := make(chan outcome, len(names))
	results := make(map[string]Result, len(names))
	pending := map[string]bool{}
	for _, name := range names {
		if !m.begin(name) {
			results[name] = m.timedOut(name, timeout, "the previous check has not returned yet")
			continue
		}
		pending[name] = true
		go func(name string, c providers.Checker) {
			start := clk.Now()
			ts := c.Check(cctx)
			m.end(name)
			done <- outcome{name: name, targets: ts, duration: clk.Since(start), at: clk.Now()}
		}(name, m.o.Checkers[name])
	}
	grace := clk.NewTimer(timeout + abandonGrace)
	defer grace.Stop()
	for len(pending) > 0 {
		select {
		case o := <-done:
			delete(pending, o.name)
			results[o.name] = Result{
				Provider: o.name, Type: m.o.Types[o.name], Targets: normalizeTargets(o.targets),
				Duration: o.duration, CheckedAt: o.at,
			}
		case <-grace.C():
			for name := range pending {
				results[name] = m.timedOut(name, timeout, fmt.Sprintf("the check did not return within %s", timeout))
			}
			pending = nil
		case <-ctx.Done():
			return nil
		}
	}
	out := make([]Result, 0, len(results))
	for _, name := range names {
		out = append(out, results[name])
	}
	return out
}

// timedOut is the result of a check that did not return: every target the
// provider reported last time (or one "check" target) not ready with
// reason Timeout.
func (m *Monitor) timedOut(name string, timeout time.Duration, msg string) Result {
	m.mu.Lock()
	prev := m.latest[name]
	m.mu.Unlock()
	r := Result{Provider: name, Type: m.o.Types[name], Duration: timeout, CheckedAt: m.o.Clock.Now()}
	for _, t := range prev.Targets {
		r.Targets = append(r.Targets, providers.TargetStatus{Target: t.Target, Reason: ReasonTimeout, Message: msg})
	}
	if len(r.Targets) == 0 {
		r.Targets = []providers.TargetStatus{{Target: fallbackTarget, Reason: ReasonTimeout, Message: msg}}
	}
	return r
}

// begin marks name's check as running; false when it still is.
func (m *Monitor) begin(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running[name] {
		return false
	}
	m.running[name] = true
	return true
}

func (m *Monitor) end(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.running, name)
}

// record logs the transitions since the previous round and makes results
// the snapshot.
func (m *Monitor) record(results []Result) {
	m.mu.Lock()
	prev := m.latest
	m.latest = make(map[string]Result, len(results))
	for _, r := range results {
		m.latest[r.Provider] = r
	}
	m.mu.Unlock()
	for _, r := range results {
		for _, tr := range transitions(prev[r.Provider].Targets, r.Targets) {
			t := tr.target
			if tr.ready {
				m.o.Logger.Info("provider target ready", "provider", r.Provider, "type", r.Type, "target", t.Target)
				continue
			}
			m.o.Logger.Info("WARNING: provider target not ready", "provider", r.Provider, "type", r.Type,
				"target", t.Target, "reason", t.Reason, "message", t.Message)
		}
	}
}

// transition is a target whose verdict is worth a log line.
type transition struct {
	// ready is true for "back up" (or first seen ready), false for "down".
	ready  bool
	target providers.TargetStatus
}

// transitions compares two rounds of one provider: a target that went down,
// or stayed down for a different reason, is a down transition; one that came
// back (or is seen for the first time) ready is an up transition; a steady
// target is silent.
func transitions(prev, cur []providers.TargetStatus) []transition {
	before := make(map[string]providers.TargetStatus, len(prev))
	for _, t := range prev {
		before[t.Target] = t
	}
	var out []transition
	for _, t := range cur {
		p, seen := before[t.Target]
		switch {
		case !seen || p.Ready != t.Ready:
			out = append(out, transition{ready: t.Ready, target: t})
		case !t.Ready && p.Reason != t.Reason:
			out = append(out, transition{ready: false, target: t})
		}
	}
	return out
}

// publish writes r into the provider's ProviderHealth object: read straight
// from the API server, created with the managed-by label when missing, then
// one status merge patch.
func (m *Monitor) publish(ctx context.Context, r Result) error {
	var ph v1alpha1.ProviderHealth
	key := client.ObjectKey{Name: r.Provider}
	err := m.o.APIReader.Get(ctx, key, &ph)
	if apierrors.IsNotFound(err) {
		ph = v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{
			Name:   r.Provider,
			Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
		}}
		err = m.o.Client.Create(ctx, &ph)
		if apierrors.IsAlreadyExists(err) {
			err = m.o.APIReader.Get(ctx, key, &ph)
		}
	}
	if err != nil {
		return fmt.Errorf("reading or creating ProviderHealth %s: %w", r.Provider, err)
	}
	st := buildStatus(ph.Status, r, ph.Generation, m.o.Clock.Now())
	// A merge patch replaces lists whole; null clears targets when a round
	// reported none.
	body, err := json.Marshal(map[string]any{"status": map[string]any{
		"type":          st.Type,
		"ready":         st.Ready,
		"targetsReady":  st.TargetsReady,
		"targets":       st.Targets,
		"lastCheckTime": st.LastCheckTime,
		"conditions":    st.Conditions,
	}})
	if err != nil {
		return fmt.Errorf("encoding the status of ProviderHealth %s: %w", r.Provider, err)
	}
	if err := m.o.Client.Status().Patch(ctx, &ph, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("patching the status of ProviderHealth %s: %w", r.Provider, err)
	}
	return nil
}

// deleteStale deletes every managed ProviderHealth object whose provider is
// not checked by this process: it was removed from the providers config,
// lost its Checker, or checks are off. Failures are logged; the objects
// only report, so a leftover one is stale, not harmful.
func (m *Monitor) deleteStale(ctx context.Context) {
	var list v1alpha1.ProviderHealthList
	if err := m.o.APIReader.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}); err != nil {
		m.o.Logger.Error(err, "listing ProviderHealth objects failed; stale ones stay until the next start")
		return
	}
	for i := range list.Items {
		ph := &list.Items[i]
		if _, checked := m.o.Checkers[ph.Name]; checked && m.o.Interval > 0 {
			continue
		}
		err := m.o.Client.Delete(ctx, ph)
		if err != nil && !apierrors.IsNotFound(err) {
			m.o.Logger.Error(err, "deleting a stale ProviderHealth failed", "providerHealth", ph.Name)
			continue
		}
		m.o.Logger.Info("deleted the ProviderHealth of a provider that is not checked", "providerHealth", ph.Name,
			"checksOff", m.o.Interval == 0)
	}
}

// findInvalidNames records, with a warning, the providers whose names cannot
// name a cluster-scoped object: they get metrics and logs but no object.
func (m *Monitor) findInvalidNames() {
	m.noObject = map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(m.o.Checkers)) {
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			m.noObject[name] = true
			m.o.Logger.Info("WARNING: provider name is not a valid object name; it is checked and exported as metrics, but gets no ProviderHealth object",
				"provider", name, "problems", strings.Join(msgs, "; "))
		}
	}
}
