package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/health"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// leasing is the stage that holds members for requests: a request's lease
// comes from its (session, target) pin or the pool, is reported and let go
// here, and nowhere else. It owns the pins (rotation.Affinity), the
// acquires shared by concurrent misses of one pin and the {member, target}
// pairs it saw banned. It calls the members stage (memberSource) for the
// connection state of a leased member and tells the member-health stage
// (leaseWatcher) how each lease was given.
type leasing struct {
	pool  pool.Pool
	later pool.LaterReleaser // pool, when it can release without the caller waiting; else nil
	mode  rotation.Mode
	ttl   time.Duration // Options.LeaseTTL
	// maxSessTTL is the pool's longest lease when it says (0: unknown, as
	// a --lease-api pool's): acquire refuses a longer sessttl on a pinned
	// session too, where the pool is not asked.
	maxSessTTL time.Duration
	aff        *rotation.Affinity
	flights    flightGroup
	struck     struckSet
	members    memberSource
	watch      leaseWatcher
	allow      allowance
	quota      *quotas
	rec        Recorder
	log        *slog.Logger
}

// memberSource is what leasing asks of the members stage: the state of a
// member it leased, or of one a pin names.
type memberSource interface {
	memberFor(m pool.Member) (*link.Link, error)
	memberByName(name string) *link.Link
}

// leaseWatcher hears how the pool gave each lease (the member-health
// stage: a lease of a member resting for its own failures is an override).
type leaseWatcher interface {
	Leased(l pool.Lease, target string)
}

// newLeasing makes the leasing stage on o's pool.
func newLeasing(o Options, members memberSource, watch leaseWatcher) (*leasing, error) {
	aff, err := rotation.NewAffinity(o.AffinityEntries)
	if err != nil {
		return nil, errors.New("gateway: affinity cache: " + err.Error())
	}
	later, _ := o.Pool.(pool.LaterReleaser)
	var maxSessTTL time.Duration
	if mt, ok := o.Pool.(interface{ MaxTTL() time.Duration }); ok {
		maxSessTTL = mt.MaxTTL()
	}
	q, err := newQuotas(o.Clients, o.Quotas, o.Logger)
	if err != nil {
		return nil, err
	}
	return &leasing{pool: o.Pool, later: later, mode: o.Mode, ttl: o.LeaseTTL, maxSessTTL: maxSessTTL, aff: aff,
		members: members, watch: watch, allow: newAllowance(o.Clients, o.Pool), quota: q, rec: o.Metrics, log: o.Logger}, nil
}

// pinReleaseWait bounds how long a stopping gateway spends handing its
// pins' leases back to the pool.
const pinReleaseWait = 5 * time.Second

// close ends the pins' expiry and hands the pins' leases back to the pool.
// A gateway that stops (a sidecar whose crawler finished, a shared gateway
// rolled over) would otherwise leave them held in a shared pool for the
// rest of their TTL, counted against members no one uses. Called once no
// request is left; a release the pool does not take in pinReleaseWait is
// left to expire, as it would have.
func (ls *leasing) close() {
	ls.aff.Close()
	pins := ls.aff.Drain()
	if len(pins) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), pinReleaseWait)
	defer cancel()
	released := 0
	for _, p := range pins {
		if ctx.Err() != nil {
			break
		}
		ls.quota.ended(ctx, p.LeaseID)
		if err := ls.pool.Release(ctx, p.LeaseID); err != nil {
			ls.log.Debug("lease release failed", "lease", p.LeaseID, "err", err)
			continue
		}
		released++
	}
	ls.log.Info("released the pinned leases", "released", released, "left to expire", len(pins)-released)
}

// leaseReq is one request's view of leasing: who, for which target, how.
type leaseReq struct {
	p          *params.Params
	session    string // params.Params.SessionKey()
	target     string // rotation.TargetKey
	perRequest bool
}

func (ls *leasing) newReq(p *params.Params, target string) leaseReq {
	mode := ls.mode
	if p.Rotate != "" {
		mode = p.Rotate
	}
	// A strict session is sticky whatever the rotation: it keeps its member.
	return leaseReq{p: p, session: p.SessionKey(), target: target, perRequest: mode == rotation.ModeRequest && !p.Strict}
}

// held is a lease in use by one request.
type held struct {
	id string
	mc *link.Link
	// pinned: the lease is (or was) the (session, target) pin, so it is kept
	// after the request; otherwise the request releases it when done.
	pinned bool
	// resting: the pool leased the member although it rests for its own
	// failures (pool.Lease.FailureRest); an answer through it is reported.
	resting bool
}

// health is h as the member-health stage reads it.
func (h held) health() health.Lease {
	return health.Lease{ID: h.id, Link: h.mc, Resting: h.resting}
}

// acquire returns the lease a request should use: the live pin of its
// (session, target) when it still fits the request's parameters, else a
// fresh lease from the pool (pinned unless rotating per request).
// Concurrent misses of one (session, target) share one Acquire.
func (ls *leasing) acquire(ctx context.Context, lr *leaseReq) (held, error) {
	if lr.perRequest {
		return ls.acquireFresh(ctx, *lr, false)
	}
	if ls.maxSessTTL > 0 && lr.p.SessTTL > ls.maxSessTTL {
		// The pool would refuse it on a new lease; a session that holds a
		// pin gets the same answer, not a silent pass.
		return held{}, fmt.Errorf("%w: sessttl %s", pool.ErrTTLTooLong, lr.p.SessTTL)
	}
	if pin, ok := ls.aff.Get(lr.session, lr.target); ok {
		mc := ls.members.memberByName(pin.Member)
		switch {
		case pin.Lost && lr.p.Strict:
			return held{}, &sessionLostError{member: pin.Member, why: "was lost earlier"}
		case pin.Lost:
			// The session is no longer strict: it may move on.
			ls.aff.Delete(lr.session, lr.target)
		case mc == nil && lr.p.Strict:
			// The gateway forgot the member (it left, or sat idle): lease
			// it again by name, or the session is lost.
			ls.release(ctx, *lr, held{id: pin.LeaseID, pinned: true})
			same := *lr.p
			same.Proxy = pin.Member
			again := *lr
			again.p = &same
			if h, err := ls.acquireFresh(ctx, again, true); err == nil {
				return h, nil
			}
			ls.markLost(lr, pin.Member)
			return held{}, &sessionLostError{member: pin.Member, why: "left the pool"}
		case mc != nil && fits(mc, lr.p):
			return held{id: pin.LeaseID, mc: mc, pinned: true}, nil
		}
		if !pin.Lost {
			// The pin is about to be replaced (its member left, or this
			// request names another proxy or selector): give its lease back
			// rather than let it hold a place at its member until the TTL.
			ls.release(ctx, *lr, held{id: pin.LeaseID, pinned: true})
		}
	}
	key := rotation.PinKey(lr.session, lr.target)
	f, leader := ls.flights.begin(key)
	if !leader {
		select {
		case <-f.done:
			if f.err == nil && fits(f.h.mc, lr.p) {
				return f.h, nil
			}
		case <-ctx.Done():
			return held{}, ctx.Err()
		}
		return ls.acquireFresh(ctx, *lr, true)
	}
	h, err := ls.acquireFresh(ctx, *lr, true)
	f.h, f.err = h, err
	ls.flights.end(key, f)
	return h, err
}

func (ls *leasing) acquireFresh(ctx context.Context, lr leaseReq, pin bool) (held, error) {
	ttl := lr.p.SessTTL
	if ttl == 0 && pin {
		ttl = ls.ttl
	}
	if lr.p.Client != "" {
		ctx = pool.WithClient(ctx, pool.Client{Name: lr.p.Client})
	}
	// The client's lease quota is decided before the pool is asked.
	holder, err := ls.quota.take(ctx, lr.p.Client, cmp.Or(ttl, ls.ttl))
	if err != nil {
		return held{}, err
	}
	l, err := ls.allow.acquire(ctx, ls.pool, lr.p.Client, pool.AcquireRequest{Selector: lr.p.Selector, Proxy: lr.p.Proxy, Target: lr.target, TTL: ttl})
	if err != nil {
		ls.quota.giveBack(ctx, lr.p.Client, holder)
		return held{}, err
	}
	ls.quota.leased(lr.p.Client, holder, l.ID, l.ExpiresAt)
	mc, err := ls.members.memberFor(l.Member)
	if err != nil {
		// A member the gateway cannot use (bad scheme): count it as failed so
		// the pool stops offering it, and say so.
		ls.log.Warn("unusable pool member", "member", l.Member.Name, "err", err)
		ls.rec.UpstreamFailure(l.Member.Name)
		_ = ls.pool.Report(ctx, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed, Target: lr.target})
		_ = ls.pool.Release(ctx, l.ID)
		ls.quota.ended(ctx, l.ID)
		return held{}, err
	}
	if pin {
		if d := time.Until(l.ExpiresAt); d > 0 {
			if err := ls.aff.Set(lr.session, lr.target, rotation.Pin{LeaseID: l.ID, Member: l.Member.Name, ExpiresAt: l.ExpiresAt}, d); err != nil {
				// Every place holds a live session: this new one gets no
				// member rather than one it would not keep.
				_ = ls.pool.Release(ctx, l.ID)
				ls.quota.ended(ctx, l.ID)
				return held{}, &sessionLimitError{max: ls.aff.Max()}
			}
		}
	}
	ls.watch.Leased(l, lr.target)
	return held{id: l.ID, mc: mc, pinned: pin, resting: l.FailureRest}, nil
}

// sessionLimitError refuses a new sticky session while the gateway holds
// its maximum of live ones: 503 session_limit, no member leased.
type sessionLimitError struct{ max int64 }

func (e *sessionLimitError) Error() string {
	return "the gateway holds its limit of " + strconv.FormatInt(e.max, 10) +
		" live sticky sessions (--max-sessions); a new session gets a member once one ends (its lease TTL): retry later, reuse a session name, or use per-request rotation"
}

// sessionLostError ends a request of a strict session whose member was
// banned, failed or left: 502 session_lost, never another member.
type sessionLostError struct {
	member string
	why    string
}

func (e *sessionLostError) Error() string {
	return "session lost: its member " + e.member + " " + e.why + "; a strict session never moves to another member: name a new session to go on"
}

// markLost remembers that lr's strict session lost member, for as long as
// its pin would have lasted, so its next request fails too instead of
// being pinned afresh.
func (ls *leasing) markLost(lr *leaseReq, member string) {
	ttl := lr.p.SessTTL
	if ttl == 0 {
		ttl = ls.ttl
	}
	_ = ls.aff.Set(lr.session, lr.target, rotation.Pin{Member: member, Lost: true, ExpiresAt: time.Now().Add(ttl)}, ttl) // a Lost mark is always kept
}

// fits reports whether a pinned member still satisfies the request's
// parameters (a later request of the session may name a proxy or selector).
func fits(mc *link.Link, p *params.Params) bool {
	if p.Proxy != "" && mc.Member.Name != p.Proxy {
		return false
	}
	for k, v := range p.Selector {
		if mc.Member.Attributes[k] != v {
			return false
		}
	}
	return true
}

// done ends a request's use of h: a per-request lease is released, a pin
// kept. Nothing waits on this release, so a pool that can send it later
// (with its next acquire) does.
func (ls *leasing) done(ctx context.Context, h held) {
	if h.pinned {
		return
	}
	ls.quota.ended(ctx, h.id)
	if ls.later != nil {
		ls.later.ReleaseLater(h.id)
		return
	}
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if err := ls.pool.Release(ctx, h.id); err != nil {
		ls.log.Debug("lease release failed", "lease", h.id, "err", err)
	}
}

// siteRetryAfter is the Retry-After of a site's answer with header that
// the classifier read as res, for drop: honoured for a rate limit only
// (a ban's cooldown is the gateway's), zero when there is none.
func siteRetryAfter(res rotation.Result, header http.Header) time.Duration {
	if res != rotation.ResultRateLimited {
		return 0
	}
	v := header["Retry-After"]
	if len(v) == 0 {
		return 0
	}
	ra, _ := rotation.ParseRetryAfter(v[0], time.Now())
	return ra
}

// drop reports a ban or failure on h, unpins it and releases it, so the
// next Acquire for this target picks another member. Only member-wide
// failures count in the upstream-failure metric: a member's answer that a
// site is unreachable is no failure of the member.
func (ls *leasing) drop(ctx context.Context, lr leaseReq, h held, res rotation.Result, retryAfter time.Duration) {
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	switch {
	case res == rotation.ResultUpstreamFailed:
		ls.rec.UpstreamFailure(h.mc.Member.Name)
	case res.IsBan():
		ls.struck.add(h.mc.Member.Name, lr.target)
	}
	if err := ls.pool.Report(ctx, h.id, pool.Report{Result: res, Target: lr.target, RetryAfter: retryAfter}); err != nil {
		ls.log.Warn("lease report failed", "lease", h.id, "member", h.mc.Member.Name, "result", string(res), "err", err)
	}
	ls.release(ctx, lr, h)
}

// release unpins h (when it is still the pin) and releases it, pinned or
// not, so the session's next request leases afresh.
func (ls *leasing) release(ctx context.Context, lr leaseReq, h held) {
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if h.pinned {
		if pin, ok := ls.aff.Get(lr.session, lr.target); ok && pin.LeaseID == h.id {
			ls.aff.Delete(lr.session, lr.target)
		}
	}
	ls.quota.ended(ctx, h.id)
	if err := ls.pool.Release(ctx, h.id); err != nil {
		ls.log.Debug("lease release failed", "lease", h.id, "err", err)
	}
}

// succeeded tells the pool a {member, target} that was banned before works
// again, which resets its ban backoff. Only pairs this gateway saw banned
// are reported, so a healthy crawl costs no pool calls.
func (ls *leasing) succeeded(ctx context.Context, lr *leaseReq, h held) {
	if !ls.struck.take(h.mc.Member.Name, lr.target) {
		return
	}
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if err := ls.pool.Report(ctx, h.id, pool.Report{Result: rotation.ResultOK, Target: lr.target}); err != nil {
		ls.log.Debug("lease report failed", "lease", h.id, "result", "ok", "err", err)
	}
}

// flightGroup lets concurrent lease misses of one (session, target) wait for
// a single Acquire instead of each leasing (and leaking) a member.
type flightGroup struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	h    held
	err  error
}

func (fg *flightGroup) begin(key string) (*flight, bool) {
	fg.mu.Lock()
	defer fg.mu.Unlock()
	if f, ok := fg.m[key]; ok {
		return f, false
	}
	if fg.m == nil {
		fg.m = make(map[string]*flight)
	}
	f := &flight{done: make(chan struct{})}
	fg.m[key] = f
	return f, true
}

func (fg *flightGroup) end(key string, f *flight) {
	fg.mu.Lock()
	delete(fg.m, key)
	fg.mu.Unlock()
	close(f.done)
}

// maxStruck bounds the struck set; when full it starts over, which only
// means some backoffs are not reset early (they still expire on their own).
const maxStruck = 16384

type struckKey struct{ member, target string }

// struckSet remembers {member, target} pairs this gateway reported a ban for.
type struckSet struct {
	n  atomic.Int64
	mu sync.Mutex
	m  map[struckKey]struct{}
}

func (s *struckSet) add(member, target string) {
	s.mu.Lock()
	if s.m == nil || len(s.m) >= maxStruck {
		s.m = make(map[struckKey]struct{})
	}
	s.m[struckKey{member, target}] = struct{}{}
	s.n.Store(int64(len(s.m)))
	s.mu.Unlock()
}

// take reports whether the pair was struck and forgets it. The common case
// (nothing struck) is one atomic load.
func (s *struckSet) take(member, target string) bool {
	if s.n.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := struckKey{member, target}
	if _, ok := s.m[k]; !ok {
		return false
	}
	delete(s.m, k)
	s.n.Store(int64(len(s.m)))
	return true
}

// lease returns the lease for rq's next attempt, or the error that ends
// the request: the client leaving, or the pool's refusal in words a
// client can act on.
func (ls *leasing) lease(ctx context.Context, client context.Context, rq *request) (held, error) {
	h, err := ls.acquire(ctx, &rq.lr)
	switch {
	case err == nil:
		return h, nil
	case isSessionLost(err):
		return held{}, err
	}
	if client.Err() != nil {
		return held{}, fault.ErrClientGone
	}
	return held{}, ls.poolRefusal(&rq.lr, err)
}

// isSessionLost reports whether err is a strict session's loss (apart, so
// the lease path's success allocates nothing for it).
func isSessionLost(err error) bool {
	var sl *sessionLostError
	return errors.As(err, &sl)
}

// poolRefusal says why the pool gave no lease: which parameter matched
// nothing, the TTL that is too long and whose it is, the unreachable API.
func (ls *leasing) poolRefusal(lr *leaseReq, err error) error {
	var nm *pool.NoMatchError
	switch {
	case errors.As(err, &nm):
		if nm.Considered == 0 {
			// Nothing even matched: say which parameter ruled everything
			// out, since the counts alone read as an empty pool.
			switch {
			case lr.p.Proxy != "":
				return &fault.Annotated{Err: err, Msg: "no member named " + strconv.Quote(lr.p.Proxy) + " (proxy parameter); " + nm.Error()}
			case len(lr.p.Selector) > 0:
				return &fault.Annotated{Err: err, Msg: "no member has the attributes asked for (" + selectorString(lr.p.Selector) + "); " + nm.Error()}
			}
		}
		return err
	case errors.Is(err, pool.ErrTTLTooLong) && lr.p.SessTTL == 0:
		ls.log.Error("the gateway's lease TTL is above the pool's maximum: lower --lease-ttl", "leaseTTL", ls.ttl, "err", err)
		return &poolConfigError{err: errors.New("the gateway's lease TTL " + ls.ttl.String() + " is above the pool's maximum (" + err.Error() + "); lower the gateway's --lease-ttl")}
	case errors.Is(err, pool.ErrTTLTooLong):
		msg := "sessttl above the pool's maximum lease TTL"
		if mt, ok := ls.pool.(interface{ MaxTTL() time.Duration }); ok && mt.MaxTTL() > 0 {
			msg += " of " + mt.MaxTTL().String()
		}
		return &fault.Annotated{Err: err, Msg: msg}
	case errors.Is(err, pool.ErrUnreachable):
		return err
	case errors.Is(err, pool.ErrForbidden) && lr.p.Client != "":
		// A token client asked for members outside its allowance: the
		// allowance's words name them.
		return &fault.Annotated{Err: err, Msg: err.Error()}
	case errors.Is(err, pool.ErrForbidden):
		// Its identity has no right to lease, or its namespace was not
		// given the Proxies asked for (not_shared): the API's words say which.
		return &fault.Annotated{Err: err, Msg: "the lease API refused the lease: " + err.Error()}
	}
	var sm *sessionLimitError
	var qe *quotaError
	if errors.As(err, &sm) || errors.As(err, &qe) {
		return err
	}
	ls.log.Warn("lease acquire failed", "err", err)
	return &fault.Annotated{Err: errLeaseFailed, Msg: "lease failed: " + err.Error()}
}

// lostSession ends a strict session's request whose member h was banned
// or failed: the session is marked lost and the request fails
// session_lost; it never goes on to another member.
func (ls *leasing) lostSession(rq *request, h held, why string) error {
	ls.markLost(&rq.lr, h.mc.Member.Name)
	return &sessionLostError{member: h.mc.Member.Name, why: why}
}
