// Package lastknown is a --lease-api gateway's last-known pool: a pool.Pool
// that leases from the controller's lease API while it answers, keeps the
// API's member list (credentials, health, cooldowns) in a local pool.Store,
// and leases from that store itself while the API is away — for at most
// Options.Grace after the API's last answer. When the API returns it is
// told what the gateway learnt meanwhile (bans and failures), and leasing
// goes back to it; cooldowns of both sides are kept, the longer winning.
//
// A gateway on a shared Redis lease store uses the same pool with the store
// as its remote (the store's ListMembers as the list, its
// pool.ErrStoreUnavailable as the outage): a Redis restart, AOF load or
// failover is ridden out the same way.
//
// It is the data plane's answer to a control-plane outage, in the way of
// Envoy's last-known configuration: a controller restart, an upgrade or a
// failover of its store must not fail a crawler's request when the members
// themselves are fine. The bound exists because the list ages: members are
// replaced, logins rotated, Proxies drained, and after a while a list the
// controller can no longer vouch for is worse than an honest 503.
//
// It imports pool, pool/leaseapi and rotation; never gateway or controller.
package lastknown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Defaults of Options' zero values.
const (
	// DefaultGrace is how long after the lease API's last answer the
	// gateway goes on leasing from its last-known members. Five minutes
	// covers what a control plane does to itself: a controller Pod
	// replaced by an upgrade or a drained node (image pull, cache sync:
	// tens of seconds, a minute or two on a busy cluster), a Redis Sentinel
	// failover (30 s to notice, seconds to promote) and a short network
	// partition; it is short next to how fast a fleet changes under it
	// (ProxyPool rotations, drains, rotated logins), so a list that old is
	// still the fleet. A controller down for longer is an incident an
	// operator must see, and crawlers then get 503 pool_unreachable saying
	// so.
	DefaultGrace = 5 * time.Minute
	// DefaultRefresh is how often the member list is read again while the
	// API answers: members and health change at the pace of Proxy objects,
	// and the gateway's own bans reach the local store at once (Report), so
	// the list only has to bring other gateways' cooldowns and health.
	DefaultRefresh = 30 * time.Second
	// DefaultProbe is how often the API is asked again while it is away:
	// often enough that its return ends the outage within a second, cheap
	// enough for every gateway of a fleet to do.
	DefaultProbe = time.Second
	// DefaultCallTimeout bounds each lease API call, so that an API that
	// does not answer at all (a black-holed address) is taken for away
	// after this long instead of the client's 30 s; a healthy API answers
	// in well under a millisecond.
	DefaultCallTimeout = 2 * time.Second
	// maxTracked bounds the leases whose member is remembered (see
	// tracked); when full, new leases are not tracked, which only means a
	// report on one of them during an outage is not applied locally.
	maxTracked = 1 << 17
	// maxLearnt bounds what is kept to tell the API on its return.
	maxLearnt = 4096
	// localPrefix marks the IDs of leases the gateway granted itself; lease
	// API IDs are base32 upper case, so they never start with it.
	localPrefix = "local-"
	// pushAttempts is how many refreshes a learnt cooldown the API refused
	// to take (the member at capacity, or resting already for a shorter
	// time) is offered again.
	pushAttempts = 30
)

// Remote is the lease API as the last-known pool uses it; *leaseapi.Client
// implements it.
type Remote interface {
	pool.Pool
	// Members lists the members with their credentials, health and cooldowns.
	Members(ctx context.Context) ([]pool.MemberStatus, error)
}

// Recorder counts outages and the leases granted during them (Prometheus
// counters in cmd/proxyfleet); nil records nothing.
type Recorder interface {
	// PoolOutage is called once per outage, when it begins.
	PoolOutage()
	// LastKnownLease is called for every lease granted from the last-known list.
	LastKnownLease()
}

// Options configures New. Zero durations are the defaults.
type Options struct {
	// Remote is the lease API; required.
	Remote Remote
	// Grace is how long after the API's last answer the last-known members
	// are leased (DefaultGrace).
	Grace time.Duration
	// Refresh is how often the member list is read while the API answers
	// (DefaultRefresh).
	Refresh time.Duration
	// Probe is how often the API is asked while it is away (DefaultProbe).
	Probe time.Duration
	// CallTimeout bounds each call to the API (DefaultCallTimeout).
	CallTimeout time.Duration
	// Store configures the local store: lease TTLs, cooldown policy,
	// failure windows, as for a gateway's own pool. Its Clock is Clock.
	Store pool.StoreOptions
	// Clock is the time source of the grace and the local store (the real
	// clock when nil). Tickers run on real time.
	Clock clock.PassiveClock
	// Recorder counts outages; may be nil.
	Recorder Recorder
	// Logger gets the outage's start, its end and what was told; nil discards.
	Logger *slog.Logger
}

// Pool is a pool.Pool over the lease API with a last-known fallback. Run
// must run for the list to be kept; until a list has been received an
// outage is answered as before, with pool.ErrUnreachable.
type Pool struct {
	o     Options
	local *pool.Store

	// down is the outage's start in Unix nanoseconds, 0 while the API
	// answers: the one read on the request path.
	down atomic.Int64
	// lastOK is when the API last answered (Unix nanoseconds).
	lastOK atomic.Int64
	// pending counts learnt cooldowns not yet told; a lease from the API
	// is checked against them only when there are any.
	pending atomic.Int64
	// wake asks Run to probe now (an answer came while down).
	wake chan struct{}

	mu      sync.Mutex
	listAt  time.Time // when the last list arrived; zero: never
	members int       // members in that list
	cause   string    // the error that began the outage
	told    bool      // the outage beyond the grace was logged
	noList  string    // why the API gives no list (an old controller), logged once
	tracked map[string]tracked
	learnt  map[learntKey]*learnt
	// unreleased are the remote's leases released while it was away,
	// released there when it is back (so they stop counting as active
	// before their TTL ends); at most maxLearnt.
	unreleased []string
}

// tracked is a lease's member and target, so a report that names only the
// lease can be applied to the local store and told to the API later.
type tracked struct {
	member, target string
	expires        time.Time
}

type learntKey struct{ member, target string }

// learnt is a ban or failure the API has not been told yet.
type learnt struct {
	result   rotation.Result
	attempts int
}

// New checks o and returns the pool; nothing runs until Run.
func New(o Options) (*Pool, error) {
	if o.Remote == nil {
		return nil, errors.New("lastknown: Options.Remote is required")
	}
	for name, d := range map[string]time.Duration{"Grace": o.Grace, "Refresh": o.Refresh, "Probe": o.Probe, "CallTimeout": o.CallTimeout} {
		if d < 0 {
			return nil, fmt.Errorf("lastknown: Options.%s %s is negative", name, d)
		}
	}
	if o.Grace == 0 {
		o.Grace = DefaultGrace
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Probe == 0 {
		o.Probe = DefaultProbe
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Store.Clock = o.Clock
	return &Pool{
		o:       o,
		local:   pool.NewStore(o.Store),
		wake:    make(chan struct{}, 1),
		tracked: map[string]tracked{},
		learnt:  map[learntKey]*learnt{},
	}, nil
}

var _ pool.Pool = (*Pool)(nil)

// isOutage reports whether err says the remote is away: the lease API's
// (no answer, a 5xx: leaseapi.IsOutage) or a shared lease store's
// (pool.ErrStoreUnavailable: Redis down, failing over, loading its AOF),
// for a gateway that rides out its Redis store the same way.
func isOutage(err error) bool {
	return leaseapi.IsOutage(err) || errors.Is(err, pool.ErrStoreUnavailable)
}

// ReleaseLater is pool.LaterReleaser: a lease of a remote that can release
// later (the Redis store, which sends it with its next acquire) is given
// back that way while the remote answers; any other lease is released at
// once, as Release does.
func (p *Pool) ReleaseLater(leaseID string) {
	if lr, ok := p.o.Remote.(pool.LaterReleaser); ok && p.down.Load() == 0 && !strings.HasPrefix(leaseID, localPrefix) {
		p.untrack(leaseID)
		lr.ReleaseLater(leaseID)
		return
	}
	_ = p.Release(context.Background(), leaseID)
}

// Acquire leases from the API while it answers. On an outage (no answer or
// a 5xx, leaseapi.IsOutage) it leases from the last-known members instead,
// that call included, until the grace after the API's last answer ends;
// then, or with no list ever received, it refuses with an error wrapping
// pool.ErrUnreachable that says why. An answer about the request (409,
// 400, 401) is returned as it is.
func (p *Pool) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	if p.down.Load() != 0 {
		if err := p.usable(); err == nil {
			return p.acquireLocal(ctx, req)
		}
		// Beyond the grace the API is asked again: refusing costs as much.
	}
	l, err := p.acquireRemote(ctx, req)
	if err == nil {
		return l, nil
	}
	if !isOutage(err) || ctx.Err() != nil {
		return pool.Lease{}, err
	}
	p.begin(err)
	if uerr := p.usable(); uerr != nil {
		return pool.Lease{}, uerr
	}
	return p.acquireLocal(ctx, req)
}

// acquireRemote leases from the API. A lease on a {member, target} the
// gateway learnt is resting longer than the API knows (the API refused the
// cooldown when it was told, being at capacity or resting it for less) is
// reported with the remaining window and given back, and another asked
// for: the longer cooldown wins on this side too.
func (p *Pool) acquireRemote(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
		l, err := p.o.Remote.Acquire(cctx, req)
		cancel()
		if err != nil {
			return l, err
		}
		p.answered()
		if p.pending.Load() == 0 || !p.tellOnLease(ctx, l) {
			p.track(l.ID, l.Member.Name, l.Target, l.ExpiresAt)
			return l, nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
	defer cancel()
	l, err := p.o.Remote.Acquire(cctx, req)
	if err == nil {
		p.track(l.ID, l.Member.Name, l.Target, l.ExpiresAt)
	}
	return l, err
}

// acquireLocal leases from the last-known members.
func (p *Pool) acquireLocal(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	l, err := p.local.Acquire(ctx, req)
	if err != nil {
		return l, err
	}
	if p.o.Recorder != nil {
		p.o.Recorder.LastKnownLease()
	}
	l.ID = localPrefix + l.ID
	p.track(l.ID, l.Member.Name, l.Target, l.ExpiresAt)
	return l, nil
}

// Release gives a lease back where it came from. A lease of the API is not
// released while the API is away: it ends by its TTL there.
func (p *Pool) Release(ctx context.Context, leaseID string) error {
	p.untrack(leaseID)
	if id, ok := strings.CutPrefix(leaseID, localPrefix); ok {
		return p.local.Release(ctx, id)
	}
	if p.down.Load() != 0 {
		p.mu.Lock()
		if len(p.unreleased) < maxLearnt {
			p.unreleased = append(p.unreleased, leaseID)
		}
		p.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
	defer cancel()
	return p.o.Remote.Release(ctx, leaseID)
}

// releaseHeld releases at the remote, now it answers again, the leases
// released while it was away; ones it cannot take now end by their TTL.
func (p *Pool) releaseHeld(ctx context.Context) int {
	p.mu.Lock()
	ids := p.unreleased
	p.unreleased = nil
	p.mu.Unlock()
	n := 0
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
		if p.o.Remote.Release(cctx, id) == nil {
			n++
		}
		cancel()
	}
	return n
}

// Report applies feedback to the local store at once (so the last-known
// members are as fresh as the gateway's own experience) and sends it to
// the API. While the API is away, a ban or failure is kept to be told on
// its return; a lease the gateway granted itself is always told that way,
// since the API never knew it.
func (p *Pool) Report(ctx context.Context, leaseID string, r pool.Report) error {
	t, known := p.lookup(leaseID)
	target := r.Target
	if target == "" {
		target = t.target
	}
	if id, ok := strings.CutPrefix(leaseID, localPrefix); ok {
		if err := p.local.Report(ctx, id, r); err != nil {
			return err
		}
		if known {
			p.learn(t.member, target, r.Result)
		}
		return nil
	}
	if known {
		_ = p.local.ReportMember(t.member, target, r) // a member the list does not have yet: nothing to rest
	}
	if p.down.Load() == 0 {
		cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
		err := p.o.Remote.Report(cctx, leaseID, r)
		cancel()
		if err == nil || !isOutage(err) || !known {
			return err
		}
	}
	if known {
		p.learn(t.member, target, r.Result)
	}
	return nil
}

// usable says whether the last-known members may be leased now, or why not.
func (p *Pool) usable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.usableLocked(p.o.Clock.Now())
}

func (p *Pool) usableLocked(now time.Time) error {
	if p.listAt.IsZero() {
		why := "no member list was received from it yet"
		if p.noList != "" {
			why = "it gives no member list to fall back on (" + p.noList + ")"
		}
		return fmt.Errorf("%w: %s, so the gateway has none to lease from by itself (%s)", pool.ErrUnreachable, why, p.cause)
	}
	last := time.Unix(0, p.lastOK.Load())
	if away := now.Sub(last); away > p.o.Grace {
		if !p.told {
			p.told = true
			p.o.Logger.Error("the lease API has not answered for longer than the outage grace: requests get 503 pool_unreachable until it does",
				"lastAnswer", last.UTC(), "grace", p.o.Grace.String(), "err", p.cause)
		}
		return fmt.Errorf("%w: it has not answered since %s (%s ago), longer than the outage grace of %s (--pool-outage-grace) "+
			"during which the gateway leases from the last-known members itself; the list is too old to trust (%s)",
			pool.ErrUnreachable, last.UTC().Format(time.RFC3339), away.Round(time.Second), p.o.Grace, p.cause)
	}
	return nil
}

// begin starts an outage (once) because of err.
func (p *Pool) begin(err error) {
	now := p.o.Clock.Now()
	if !p.down.CompareAndSwap(0, now.UnixNano()) {
		return
	}
	p.mu.Lock()
	p.cause, p.told = err.Error(), false
	listAt, members := p.listAt, p.members
	p.mu.Unlock()
	if p.o.Recorder != nil {
		p.o.Recorder.PoolOutage()
	}
	last := time.Unix(0, p.lastOK.Load())
	if listAt.IsZero() {
		p.o.Logger.Error("the lease API does not answer and no member list was received from it: requests get 503 pool_unreachable until it does", "err", err)
		return
	}
	p.o.Logger.Warn("the lease API does not answer: leasing from the last-known members until it does",
		"members", members, "listAge", now.Sub(listAt).Round(time.Millisecond).String(),
		"until", last.Add(p.o.Grace).UTC(), "grace", p.o.Grace.String(), "err", err)
}

// answered notes an answer of the API; while down it wakes Run to end the
// outage (telling the API what was learnt first).
func (p *Pool) answered() {
	p.lastOK.Store(p.o.Clock.Now().UnixNano())
	if p.down.Load() != 0 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

func (p *Pool) track(id, member, target string, expires time.Time) {
	p.mu.Lock()
	if len(p.tracked) < maxTracked {
		p.tracked[id] = tracked{member: member, target: target, expires: expires}
	}
	p.mu.Unlock()
}

func (p *Pool) untrack(id string) {
	p.mu.Lock()
	delete(p.tracked, id)
	p.mu.Unlock()
}

func (p *Pool) lookup(id string) (tracked, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tracked[id]
	return t, ok
}

// learn keeps a ban or failure to tell the API. An ok report forgets a
// pending ban of the pair: the member works for the site again.
func (p *Pool) learn(member, target string, res rotation.Result) {
	k := learntKey{member, target}
	p.mu.Lock()
	defer p.mu.Unlock()
	if res == rotation.ResultOK {
		if p.learnt[k] != nil {
			delete(p.learnt, k)
			p.pending.Store(int64(len(p.learnt)))
		}
		return
	}
	if res == rotation.ResultAnswered {
		// The member answered: a failure of it learnt meanwhile is no
		// longer news (its rest has ended here); nothing else changes.
		for lk, l := range p.learnt {
			if lk.member == member && l.result == rotation.ResultUpstreamFailed {
				delete(p.learnt, lk)
			}
		}
		p.pending.Store(int64(len(p.learnt)))
		return
	}
	if l := p.learnt[k]; l != nil {
		l.result, l.attempts = res, 0
		return
	}
	if len(p.learnt) >= maxLearnt {
		return
	}
	p.learnt[k] = &learnt{result: res}
	p.pending.Store(int64(len(p.learnt)))
}
