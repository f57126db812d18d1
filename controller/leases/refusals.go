package leases

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/proxyfleet/proxyfleet/pool"
)

// maxRefusalKeys bounds the distinct (selector, proxy) pairs the refusal log
// keeps: a storm of 409s with random selectors costs bounded memory.
const maxRefusalKeys = 1024

// refusalWindow is how long a refusal is kept: the ProxyPool autoscaler
// looks at the last minute.
const refusalWindow = time.Minute

// refusalLog remembers, per distinct request shape, when a lease request was
// last refused with 409 (no member usable), so a ProxyPool autoscaler can
// tell that requests it would have matched went unserved.
type refusalLog struct {
	clock clock.PassiveClock

	mu   sync.Mutex
	last map[string]refusal // by selector+proxy key
}

// refusal is the latest 409 for one request shape.
type refusal struct {
	selector map[string]string
	proxy    string
	at       time.Time
}

// newRefusalLog keeps refusals on clk (nil: the real clock).
func newRefusalLog(clk clock.PassiveClock) *refusalLog {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &refusalLog{clock: clk, last: map[string]refusal{}}
}

// record notes a refused request, forgetting entries older than the window
// and, past maxRefusalKeys, the oldest one.
func (l *refusalLog) record(req pool.AcquireRequest) {
	now := l.clock.Now()
	key := refusalKey(req)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.last[key]; !ok && len(l.last) >= maxRefusalKeys {
		oldest := ""
		for k, r := range l.last {
			if now.Sub(r.at) > refusalWindow {
				delete(l.last, k)
				continue
			}
			if oldest == "" || r.at.Before(l.last[oldest].at) {
				oldest = k
			}
		}
		if len(l.last) >= maxRefusalKeys {
			delete(l.last, oldest)
		}
	}
	l.last[key] = refusal{selector: maps.Clone(req.Selector), proxy: req.Proxy, at: now}
}

// lastMatching is the time of the latest refusal within the window for
// which match is true, or the zero time.
func (l *refusalLog) lastMatching(match func(selector map[string]string, proxy string) bool) time.Time {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var latest time.Time
	for k, r := range l.last {
		if now.Sub(r.at) > refusalWindow {
			delete(l.last, k)
			continue
		}
		if r.at.After(latest) && match(r.selector, r.proxy) {
			latest = r.at
		}
	}
	return latest
}

// refusalKey identifies a request shape: its sorted selector and its pin.
func refusalKey(req pool.AcquireRequest) string {
	keys := slices.Sorted(maps.Keys(req.Selector))
	var b strings.Builder
	b.WriteString(req.Proxy)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(req.Selector[k])
	}
	return b.String()
}

// recordingBackend is the store as the HTTP API sees it, noting every
// acquire refused with pool.NoMatchError (a 409).
type recordingBackend struct {
	pool.LeaseStore
	refusals *refusalLog
}

// Acquire is the store's, with 409s recorded.
func (b recordingBackend) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	l, err := b.LeaseStore.Acquire(ctx, req)
	var nm *pool.NoMatchError
	if errors.As(err, &nm) {
		b.refusals.record(req)
	}
	return l, err
}

// Members lists the store's members with their active leases and whether
// they are offered; the ProxyPool reconciler reads it to pick which Proxies
// to remove and to know when a draining one is empty.
func (a *API) Members() []pool.MemberStatus { return a.store.Members() }

// LastRefusal is when a lease request for which match is true was last
// refused with 409 within the last minute (the zero time if none). match
// gets the request's selector and its pinned proxy ("" when not pinned).
func (a *API) LastRefusal(match func(selector map[string]string, proxy string) bool) time.Time {
	return a.refusals.lastMatching(match)
}
