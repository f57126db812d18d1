package lastknown

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// trackedSlack is how long past its end a lease's member is remembered: a
// report arrives before the gateway lets go of a lease, so this only has
// to cover a slow report.
const trackedSlack = time.Minute

// Run keeps the member list: it reads it at once and every Refresh, and
// while the API is away asks again every Probe; when the API answers again
// it tells it what was learnt and ends the outage. It also runs the local
// store's upkeep, and returns when ctx ends and all of that has stopped.
func (p *Pool) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.local.Start(ctx)
	}()
	defer wg.Wait()
	p.refresh(ctx)
	for {
		every := p.o.Refresh
		if p.down.Load() != 0 {
			every = p.o.Probe
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-p.wake:
			t.Stop()
		}
		p.refresh(ctx)
	}
}

// cooldownLister is a Remote that lists its cooldowns with their reasons
// (a lease store; the lease API's list has none).
type cooldownLister interface {
	ListCooldowns(ctx context.Context) ([]pool.Cooldown, error)
}

// refresh reads the member list once and applies what it says.
func (p *Pool) refresh(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, max(p.o.CallTimeout, 10*time.Second))
	ms, err := p.o.Remote.Members(cctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return
	case err != nil && isOutage(err):
		p.begin(err)
		return
	case err != nil:
		// An answer that is no list (an older controller without
		// credentials=true, a refused token): the API is there, but there
		// is nothing to fall back on.
		p.mu.Lock()
		first := p.noList == ""
		p.noList = err.Error()
		p.mu.Unlock()
		if first {
			p.o.Logger.Warn("the lease API gives no member list: while it is away requests get 503 pool_unreachable", "err", err)
		}
		p.answered()
		p.end(0)
		return
	}
	p.answered()
	now := p.o.Clock.Now()
	health := make([]pool.MemberHealth, len(ms))
	var cds []pool.Cooldown
	for i, m := range ms {
		health[i] = pool.MemberHealth{Member: m.Member, Healthy: m.Healthy, Latency: m.Latency}
		for target, until := range m.Cooldowns {
			cds = append(cds, pool.Cooldown{Member: m.Name, Target: target, Until: until})
		}
	}
	if lc, ok := p.o.Remote.(cooldownLister); ok {
		// A store says why each cooldown runs: the local store then
		// tells a failure rest from a ban (rotation.FailureRest).
		cctx, cancel := context.WithTimeout(ctx, max(p.o.CallTimeout, 10*time.Second))
		if withWhy, err := lc.ListCooldowns(cctx); err == nil {
			cds = withWhy
		}
		cancel()
	}
	p.local.SetMembersHealth(health)
	p.local.MergeCooldowns(cds)
	p.mu.Lock()
	p.listAt, p.members, p.noList = now, len(ms), ""
	for id, t := range p.tracked {
		if now.After(t.expires.Add(trackedSlack)) {
			delete(p.tracked, id)
		}
	}
	p.mu.Unlock()
	if p.down.Load() == 0 && p.pending.Load() == 0 {
		return
	}
	told, ok := p.tell(ctx)
	if ok {
		p.releaseHeld(ctx)
		p.end(told)
	}
}

// end ends the outage, if there is one, and says so.
func (p *Pool) end(told int) {
	since := p.down.Swap(0)
	if since == 0 {
		return
	}
	p.mu.Lock()
	left := len(p.learnt)
	p.mu.Unlock()
	p.o.Logger.Info("the lease API answers again: leasing from it again",
		"after", p.o.Clock.Now().Sub(time.Unix(0, since)).Round(time.Millisecond).String(),
		"told", told, "notYetTaken", left)
}

// tell reports every learnt ban and failure whose local window still runs
// to the API, on a short lease of that member pinned by name, with the
// window's remaining time as its Retry-After, so the API rests the pair at
// least as long. ok is false when the API went away meanwhile.
func (p *Pool) tell(ctx context.Context) (told int, ok bool) {
	until := p.localWindows()
	p.mu.Lock()
	keys := make([]learntKey, 0, len(p.learnt))
	for k := range p.learnt {
		keys = append(keys, k)
	}
	p.mu.Unlock()
	now := p.o.Clock.Now()
	for _, k := range keys {
		p.mu.Lock()
		l := p.learnt[k]
		p.mu.Unlock()
		if l == nil {
			continue
		}
		left := until[k].Sub(now)
		if left <= 0 {
			p.forget(k)
			continue
		}
		switch err := p.tellOne(ctx, k, l, left); {
		case err == nil:
			told++
			p.forget(k)
		case isOutage(err):
			return told, false
		default:
			var nm *pool.NoMatchError
			p.mu.Lock()
			l.attempts++
			again := errors.As(err, &nm) && nm.Considered > 0 && l.attempts < pushAttempts
			p.mu.Unlock()
			if !again {
				p.o.Logger.Debug("the lease API did not take a cooldown learnt during its outage", "member", k.member, "target", k.target, "err", err)
				p.forget(k)
			}
		}
	}
	return told, true
}

// tellOne reports one learnt cooldown on a lease pinned to its member.
func (p *Pool) tellOne(ctx context.Context, k learntKey, l *learnt, left time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, 3*p.o.CallTimeout)
	defer cancel()
	lease, err := p.o.Remote.Acquire(cctx, pool.AcquireRequest{Proxy: k.member, Target: k.target, TTL: time.Second})
	if err != nil {
		return err
	}
	p.answered()
	err = p.o.Remote.Report(cctx, lease.ID, pool.Report{Result: l.result, Target: k.target, RetryAfter: left})
	_ = p.o.Remote.Release(cctx, lease.ID)
	return err
}

// tellOnLease reports a learnt cooldown the API has not taken yet on l,
// when l is for that very {member, target} (or the member failed for
// every target), and gives l back; it reports whether it did.
func (p *Pool) tellOnLease(ctx context.Context, l pool.Lease) bool {
	k := learntKey{l.Member.Name, l.Target}
	p.mu.Lock()
	e := p.learnt[k]
	if e == nil {
		k.target = ""
		e = p.learnt[k]
	}
	p.mu.Unlock()
	if e == nil {
		return false
	}
	left := p.localWindows()[k].Sub(p.o.Clock.Now())
	if left <= 0 {
		p.forget(k)
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 2*p.o.CallTimeout)
	defer cancel()
	err := p.o.Remote.Report(cctx, l.ID, pool.Report{Result: e.result, Target: k.target, RetryAfter: left})
	_ = p.o.Remote.Release(cctx, l.ID)
	if err == nil {
		p.forget(k)
	}
	return true
}

// localWindows is the end of every running cooldown in the local store.
func (p *Pool) localWindows() map[learntKey]time.Time {
	out := map[learntKey]time.Time{}
	cs, _ := p.local.ListCooldowns(context.Background()) // the in-memory store never fails
	for _, c := range cs {
		out[learntKey{c.Member, c.Target}] = c.Until
	}
	return out
}

func (p *Pool) forget(k learntKey) {
	p.mu.Lock()
	delete(p.learnt, k)
	p.pending.Store(int64(len(p.learnt)))
	p.mu.Unlock()
}

// Status is what the status page shows of the last-known pool.
type Status struct {
	// Down: the API does not answer (since Since).
	Down  bool
	Since time.Time
	// LastAnswer is when the API last answered; zero: never.
	LastAnswer time.Time
	// ListAt is when the member list last arrived; zero: never.
	ListAt time.Time
	// Members counts the members of that list.
	Members int
	// GraceEnds is when, the API still away, the gateway stops leasing
	// from the list (LastAnswer + grace).
	GraceEnds time.Time
	// Refusing: down, and the list cannot be used (none, or beyond the
	// grace); Why says which, as the refused requests' body does.
	Refusing bool
	Why      string
	// Untold counts learnt bans and failures the API has not taken yet.
	Untold int
}

// Status reports the pool's state now.
func (p *Pool) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{ListAt: p.listAt, Members: p.members, Untold: len(p.learnt)}
	if ns := p.lastOK.Load(); ns != 0 {
		st.LastAnswer = time.Unix(0, ns)
		st.GraceEnds = st.LastAnswer.Add(p.o.Grace)
	}
	if ns := p.down.Load(); ns != 0 {
		st.Down, st.Since = true, time.Unix(0, ns)
		if err := p.usableLocked(p.o.Clock.Now()); err != nil {
			st.Refusing, st.Why = true, err.Error()
		}
	}
	return st
}

// Members lists the last-known members as the local store holds them (its
// own leases and the cooldowns of both sides), for the status page while
// the API is away.
func (p *Pool) Members() []pool.MemberStatus { return p.local.Members() }

// ListCooldowns lists the local store's running cooldowns, with reasons.
func (p *Pool) ListCooldowns(ctx context.Context) ([]pool.Cooldown, error) {
	return p.local.ListCooldowns(ctx)
}
