// Package health is the gateway's member health: what it learns of
// members between requests. It keeps the members it reported failed and
// asks every second whether they answer again (failure rests), the
// episodes of leases of resting members (overrides, for the status page),
// the silent members it asks for any answer at all (CheckAlive) and the
// evidence of members broken for every site (rotation.MemberEvidence). It
// reports to the pool and calls no stage of the request path; it asks a
// member itself through its link (link.Aliveness).
package health

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The gateway's side of rotation.FailureRest: the pool decides who rests
// and when a resting member is leased anyway (pool.Lease.FailureRest); the
// gateway tells the pool when a member answers again, asks a member whose
// connection failed whether it is back, and says when it serves from
// resting members.

// Health is the stage that keeps what the gateway learns of members
// between requests: the members it reported failed and asks whether they
// are back (failure rests), the episodes of leases of resting members
// (overrides), the silent members it asks for any answer at all (CheckAlive)
// and the evidence of members broken for every site. It reports to the
// pool and calls no other stage.
type Health struct {
	pool        pool.Pool
	rec         Recorder
	log         *slog.Logger
	dialTimeout time.Duration
	// window is how long a member the gateway reported failed rests (the
	// lease store's --failure-cooldown).
	window   time.Duration
	evidence *rotation.MemberEvidence
	failed   failedSet
	rests    overrides
	alive    aliveSet
	// stopping ends the rechecks at Shutdown.
	stopping chan struct{}
	stopOnce sync.Once
}

// Options configures New.
type Options struct {
	// Pool hears the reports.
	Pool pool.Pool
	// Recorder counts the members reported failed (and, when it is a
	// FailureRestRecorder, the override leases).
	Recorder Recorder
	Logger   *slog.Logger
	// DialTimeout bounds an aliveness question's dial (and, capped at 5s,
	// its wait for an answer).
	DialTimeout time.Duration
	// FailureWindow is how long a member reported failed rests
	// (pool.DefaultFailureWindow when not positive).
	FailureWindow time.Duration
	// BrokenMemberSites and BrokenMemberWindow are
	// rotation.NewMemberEvidence's.
	BrokenMemberSites  int
	BrokenMemberWindow time.Duration
}

// New returns the member-health stage; Stop ends its rechecks.
func New(o Options) *Health {
	window := o.FailureWindow
	if window <= 0 {
		window = pool.DefaultFailureWindow
	}
	return &Health{pool: o.Pool, rec: o.Recorder, log: o.Logger, dialTimeout: o.DialTimeout, window: window,
		evidence: rotation.NewMemberEvidence(o.BrokenMemberSites, o.BrokenMemberWindow), stopping: make(chan struct{})}
}

// Recorder is what member health counts: a member reported failed for
// every site.
type Recorder interface {
	UpstreamFailure(member string)
}

// Lease is a lease an attempt held, as member health needs it: its ID
// (a released lease can still be reported on), the member's link, and
// whether the pool leased the member although it rests for its own
// failures (pool.Lease.FailureRest).
type Lease struct {
	ID      string
	Link    *link.Link
	Resting bool
}

// poolCallTimeout bounds a Report made after the client left (remote
// pools only; the in-process store never blocks).
const poolCallTimeout = 5 * time.Second

// bgCtx is ctx, or when it has ended (the client left) a context of its
// own, bounded by poolCallTimeout, for a report that must still be made.
func bgCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), poolCallTimeout)
}

// Stop ends the rechecks.
func (mh *Health) Stop() { mh.stopOnce.Do(func() { close(mh.stopping) }) }

const (
	// recheckEvery is how often a member resting after its connection
	// failed is asked whether it answers (aliveness): a Squid back after a
	// restart serves within a second, not after --failure-cooldown.
	recheckEvery = time.Second
	// overrideLogEvery bounds the override warnings while an episode lasts.
	overrideLogEvery = 10 * time.Second
	// maxFailed bounds failedSet; when full it starts over, which only
	// means a rest ends by its window instead of by an answer.
	maxFailed = 16384
)

// FailureRestRecorder is an optional part of a Recorder: it counts leases
// of members that rest for their own failures, taken because no other
// member could serve (proxyfleet_gateway_failure_rest_overrides_total).
type FailureRestRecorder interface {
	FailureRestOverride()
}

// silentClass reports whether a member failure of this class means the
// member gave no answer at all (a refused, reset or timed-out connection,
// a handshake cut off, a silence): only then does an answer to the
// aliveness question say it is back. A member that answers wrongly (407,
// a garbled answer, its own error name, broken for sites others reach)
// would answer that question too, and stays resting for its window.
func silentClass(class string) bool {
	switch class {
	case "dial", "timeout", "write", "tls", "error", fault.ClassAnswerTimeout:
		return true
	}
	return false
}

// failedSet remembers the members this gateway reported failed, with the
// lease each failed on, while their rest may run: an answer through one
// of them is reported (answered) so the pool ends its rest.
type failedSet struct {
	n  atomic.Int64
	mu sync.Mutex
	m  map[string]failedRec
}

type failedRec struct {
	leaseID   string
	at        time.Time
	rechecked bool // a recheck goroutine runs for it
}

// add records member's failure on leaseID; it reports whether a recheck
// should start (none runs for the member yet).
func (s *failedSet) add(member, leaseID string, recheck bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxFailed {
		s.m = make(map[string]failedRec)
	}
	prev := s.m[member]
	start := recheck && !prev.rechecked
	s.m[member] = failedRec{leaseID: leaseID, at: time.Now(), rechecked: prev.rechecked || recheck}
	s.n.Store(int64(len(s.m)))
	return start
}

// take forgets member and reports whether it was there. The common case
// (nothing failed) is one atomic load.
func (s *failedSet) take(member string) (failedRec, bool) {
	if s.n.Load() == 0 {
		return failedRec{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[member]
	if ok {
		delete(s.m, member)
		s.n.Store(int64(len(s.m)))
	}
	return r, ok
}

// recheckDue reports whether member's recheck goes on: its record is
// there and its latest failure is less than window ago. When not, the
// record's recheck mark is cleared under the same lock, so a failure
// after this starts a recheck of its own.
func (s *failedSet) recheckDue(member string, window time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[member]
	if !ok {
		return false
	}
	if time.Since(r.at) >= window {
		r.rechecked = false
		s.m[member] = r
		return false
	}
	return true
}

// overrides is the state of the current episode of override leases.
type overrides struct {
	mu     sync.Mutex
	since  time.Time // first override of the episode; zero: none runs
	last   time.Time // latest override
	logged time.Time // last warning
	count  int64     // overrides in the episode
	member string    // the latest overridden member
	active atomic.Bool
}

// OverrideStatus is the current (or latest) episode of leases of members
// resting for their own failures, for the status page.
type OverrideStatus struct {
	// Since is the episode's first override, Last its latest; zero Since
	// means there was none.
	Since, Last time.Time
	// Count is the overrides in the episode, Member the latest one's.
	Count  int64
	Member string
	// Over: a lease since Last went to a member that does not rest.
	Over bool
}

// OverrideStatus reports the latest override episode.
func (mh *Health) OverrideStatus() OverrideStatus {
	o := &mh.rests
	o.mu.Lock()
	defer o.mu.Unlock()
	return OverrideStatus{Since: o.since, Last: o.last, Count: o.count, Member: o.member, Over: !o.active.Load()}
}

// Leased notes how the pool leased l for target: an override (every
// usable member rests for its own failures) is counted and said; the
// first ordinary lease after an episode ends it.
func (mh *Health) Leased(l pool.Lease, target string) {
	o := &mh.rests
	if !l.FailureRest {
		if o.active.Load() {
			o.mu.Lock()
			if o.active.Load() {
				o.active.Store(false)
				mh.log.Info("a member that does not rest for its own failures serves again: overrides over",
					"overrides", o.count, "since", o.since)
			}
			o.mu.Unlock()
		}
		return
	}
	if fr, ok := mh.rec.(FailureRestRecorder); ok {
		fr.FailureRestOverride()
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.active.Load() {
		o.active.Store(true)
		o.since, o.count, o.logged = now, 0, time.Time{}
	}
	o.last, o.member = now, l.Member.Name
	o.count++
	if now.Sub(o.logged) >= overrideLogEvery {
		o.logged = now
		mh.log.Warn("every usable member rests for its own failures: trying the least recently failed anyway",
			"member", l.Member.Name, "target", target, "overrides", o.count, "since", o.since)
	}
}

// MemberAnswered runs when h's member answered an attempt: if it rests
// for its own failures (leased as an override, or this gateway reported it
// failed), the pool hears it answered, which ends the rest.
func (mh *Health) MemberAnswered(ctx context.Context, h Lease) {
	_, failed := mh.failed.take(h.Link.Member.Name)
	if !h.Resting && !failed {
		return
	}
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if err := mh.pool.Report(ctx, h.ID, pool.Report{Result: rotation.ResultAnswered}); err != nil {
		mh.log.Debug("lease report failed", "lease", h.ID, "result", string(rotation.ResultAnswered), "err", err)
	}
}

// MemberFailed runs after h's member failure was reported (upstream_failed)
// with class: it is remembered, and when the member gave no answer at all
// it is asked every recheckEvery whether it answers again.
func (mh *Health) MemberFailed(h Lease, class string) {
	recheck := silentClass(class) && !h.Link.Member.Direct()
	if mh.failed.add(h.Link.Member.Name, h.ID, recheck) {
		go mh.recheck(h.Link)
	}
}

// recheck asks mc whether it answers (aliveness) every recheckEvery while
// its latest failure is less than the failure window ago, and tells the
// pool once it does. It stops early when something else ended the rest (a
// request it carried) or the gateway shuts down.
func (mh *Health) recheck(mc *link.Link) {
	t := time.NewTicker(recheckEvery)
	defer t.Stop()
	for {
		select {
		case <-mh.stopping:
			return
		case <-t.C:
		}
		if !mh.failed.recheckDue(mc.Member.Name, mh.window) {
			return
		}
		if link.Aliveness(mc, mh.dialTimeout) != nil {
			continue
		}
		rec, ok := mh.failed.take(mc.Member.Name)
		if !ok {
			return
		}
		mh.log.Info("member answers again: its failure rest ends", "member", mc.Member.Name, "failedAt", rec.at)
		ctx, cancel := context.WithTimeout(context.Background(), poolCallTimeout)
		if err := mh.pool.Report(ctx, rec.leaseID, pool.Report{Result: rotation.ResultAnswered}); err != nil {
			mh.log.Warn("lease report failed", "lease", rec.leaseID, "member", mc.Member.Name, "result", string(rotation.ResultAnswered), "err", err)
		}
		cancel()
		return
	}
}

// Reached runs after member carried the request to target: it clears the
// member's own record, and every member that failed this site in this
// request was contradicted by it. A member contradicted on enough distinct
// sites is broken for everyone, which is then reported member-wide on the
// (released but still reportable) lease it failed with.
func (mh *Health) Reached(ctx context.Context, member, target string, fails fault.SiteFailures) {
	mh.evidence.Reached(member)
	if len(fails) == 0 {
		return
	}
	now := time.Now()
	for _, f := range fails {
		if f.Member == member || !mh.evidence.Contradicted(f.Member, target, now) {
			continue
		}
		mh.log.Warn("member fails sites other members reach: out of service for every site",
			"member", f.Member, "lastTarget", target, "answer", f.Msg)
		mh.rec.UpstreamFailure(f.Member)
		rctx, cancel := bgCtx(ctx)
		if err := mh.pool.Report(rctx, f.LeaseID, pool.Report{Result: rotation.ResultUpstreamFailed, Target: target}); err != nil {
			mh.log.Warn("lease report failed", "lease", f.LeaseID, "member", f.Member, "result", string(rotation.ResultUpstreamFailed), "err", err)
		}
		cancel()
	}
}

// CheckAlive follows an answer timeout of h's member: in the background,
// it asks the member for something it answers without any site (aliveness
// below). A member that sends back nothing at all (a hung Squid, a frozen
// VM, a half-dead NAT) is broken, not waiting on a slow site: it is reported
// failed on h's lease (released but still reportable), so it is out for
// every site now, not after a minute of requests that each wait out their
// timeout. The request itself does not wait for the answer.
func (mh *Health) CheckAlive(ctx context.Context, h Lease, target string) {
	mc := h.Link
	if mc.Member.Direct() || !mh.alive.begin(mc.Member.Name) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer mh.alive.end(mc.Member.Name)
		err := link.Aliveness(mc, mh.dialTimeout)
		if err == nil {
			// It answers: if it rests for its own failures, that ends.
			if rec, ok := mh.failed.take(mc.Member.Name); ok {
				rctx, cancel := bgCtx(ctx)
				defer cancel()
				if err := mh.pool.Report(rctx, rec.leaseID, pool.Report{Result: rotation.ResultAnswered}); err != nil {
					mh.log.Debug("lease report failed", "lease", rec.leaseID, "result", string(rotation.ResultAnswered), "err", err)
				}
			}
			return
		}
		mh.log.Warn("member answers nothing, not even a request it needs no site for: out of service for every site",
			"member", mc.Member.Name, "lastTarget", target, "err", err)
		mh.rec.UpstreamFailure(mc.Member.Name)
		rctx, cancel := bgCtx(ctx)
		defer cancel()
		if err := mh.pool.Report(rctx, h.ID, pool.Report{Result: rotation.ResultUpstreamFailed, Target: target}); err != nil {
			mh.log.Warn("lease report failed", "lease", h.ID, "member", mc.Member.Name, "result", string(rotation.ResultUpstreamFailed), "err", err)
		}
		mh.MemberFailed(h, fault.ClassAnswerTimeout)
	}()
}

// aliveSet keeps one aliveness check per member at a time.
type aliveSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (s *aliveSet) begin(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[name]; ok {
		return false
	}
	if s.m == nil {
		s.m = make(map[string]struct{})
	}
	s.m[name] = struct{}{}
	return true
}

func (s *aliveSet) end(name string) {
	s.mu.Lock()
	delete(s.m, name)
	s.mu.Unlock()
}
