package gateway

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/rotation"
	"github.com/proxyfleet/proxyfleet/status"
)

// DefaultPacingMaxWait is how long a request waits for its slot when
// PacingOptions.MaxWait is zero.
const DefaultPacingMaxWait = 30 * time.Second

// maxPaceSites bounds the sites the pacer keeps state for; past it, sites
// with nothing in flight, nothing queued and nothing learnt are forgotten.
const maxPaceSites = 10_000

// PacingOptions configure pacing (Options.Pacing): how fast the gateway
// sends requests to a site, so that the site has no reason to ban. The
// zero value paces nothing.
type PacingOptions struct {
	// Default is every site's pace where no entry of Sites names it
	// (--site-min-interval, --site-max-concurrency).
	Default rotation.PaceLimits
	// Sites replace Default for the sites they name (--site-pace).
	Sites SitePaces
	// Auto is the automatic slow-down (--pacing auto): a site's first
	// rate_limited or banned answer cuts its pace for the whole pool,
	// answers raise it again slowly (rotation.LearntPace).
	Auto bool
	// MaxWait bounds a request's wait for its slot (default
	// DefaultPacingMaxWait); past it the answer is 503 paced.
	MaxWait time.Duration
}

// SitePaces are explicit paces per site (--site-pace PATTERN
// [min-interval=DURATION] [max-concurrency=N]).
type SitePaces struct {
	t sitePatterns[rotation.PaceLimits]
}

// ParseSitePaces reads entries of the form `PATTERN key=value ...`, the
// pattern a host, *.domain or IP, the keys min-interval (a duration, 0
// for none) and max-concurrency (an integer, 0 for unlimited). An entry
// replaces the default pace for its sites in what it names; what it does
// not name stays the default.
func ParseSitePaces(entries []string, def rotation.PaceLimits) (SitePaces, error) {
	var sp SitePaces
	for _, e := range entries {
		fields := strings.Fields(e)
		if len(fields) < 2 {
			return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": want PATTERN min-interval=DURATION max-concurrency=N (either or both), e.g. \"*.example.com min-interval=2s max-concurrency=4\"")
		}
		lim := def
		seen := map[string]bool{}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok || seen[k] {
				return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": " + echo.Quote(f) + " is not a key=value given once (min-interval=DURATION, max-concurrency=N)")
			}
			seen[k] = true
			switch k {
			case "min-interval":
				d, err := time.ParseDuration(v)
				if err != nil || d < 0 {
					return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": min-interval " + echo.Quote(v) + " is not a duration of 0 or more")
				}
				lim.MinInterval = d
			case "max-concurrency":
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": max-concurrency " + echo.Quote(v) + " is not an integer of 0 or more")
				}
				lim.MaxConcurrency = n
			default:
				return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": unknown key " + echo.Quote(k) + " (want min-interval or max-concurrency)")
			}
		}
		if err := sp.t.add(e, fields[0], lim); err != nil {
			return SitePaces{}, err
		}
	}
	return sp, nil
}

// For returns the pace set for host, and whether one is.
func (sp SitePaces) For(host string) (rotation.PaceLimits, bool) { return sp.t.For(host) }

// pacer keeps each paced site's state: the learnt pace, the requests in
// flight and waiting, the next free slot of each member. A site with no
// limit of any kind never enters it; when no limit is configured and no
// site was ever slowed, a request costs two loads.
type pacer struct {
	o        PacingOptions
	explicit bool         // a limit is configured for some site
	learnt   atomic.Int64 // sites with a learnt pace now

	mu    sync.Mutex
	sites map[string]*sitePace
}

func newPacer(o PacingOptions) *pacer {
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultPacingMaxWait
	}
	return &pacer{o: o, explicit: !o.Default.IsZero() || !o.Sites.t.empty(), sites: map[string]*sitePace{}}
}

// sitePace is one site's state, guarded by pacer.mu.
type sitePace struct {
	learnt   rotation.LearntPace
	inflight int
	waiters  []*concWaiter // FIFO, for a place in flight
	members  map[string]time.Time
	queued   int
	// counters for the status page and metrics
	waited    uint64
	waitedFor time.Duration
	refused   uint64
	lastLimit string // the limit that held the last waiting request
	// struck are the members the site banned since its last cut: a
	// further ban through one of them is no news (LearntPace.Ban).
	struck map[string]bool
}

type concWaiter struct {
	ready chan struct{}
	given bool
}

// explicitFor is the operator's pace for target, met with the client's own.
func (p *pacer) explicitFor(target string, client time.Duration) (lim rotation.PaceLimits, src string) {
	lim, src = p.o.Default, "--site-min-interval"
	if l, ok := p.o.Sites.For(target); ok {
		lim, src = l, "--site-pace"
	}
	if client > lim.MinInterval {
		lim.MinInterval, src = client, "the client's pace"
	}
	return lim, src
}

// paced reports whether target may need pacing at all; false is the fast
// path of every site without limits.
func (p *pacer) paced(client time.Duration) bool {
	return p != nil && (p.explicit || client > 0 || p.learnt.Load() > 0)
}

// site returns target's state, making it; p.mu is held.
func (p *pacer) site(target string) *sitePace {
	sp := p.sites[target]
	if sp == nil {
		if len(p.sites) >= maxPaceSites {
			p.sweep()
		}
		sp = &sitePace{members: map[string]time.Time{}}
		p.sites[target] = sp
	}
	return sp
}

// sweep forgets the sites with nothing in flight, waiting or learnt.
func (p *pacer) sweep() {
	now := time.Now()
	for k, sp := range p.sites {
		if sp.inflight == 0 && sp.queued == 0 && !sp.learnt.Decayed(now).Slowed() {
			delete(p.sites, k)
		}
	}
}

// learntFor is target's learnt pace now (p.mu held), decayed when quiet.
func (p *pacer) learntFor(sp *sitePace, now time.Time) rotation.LearntPace {
	if sp == nil {
		return rotation.LearntPace{}
	}
	if sp.learnt.Slowed() {
		if l := sp.learnt.Decayed(now); !l.Slowed() {
			sp.learnt = l
			p.learnt.Add(-1)
		}
	}
	return sp.learnt
}

// pacedError is a request that could not get its slot within MaxWait.
type pacedError struct {
	retryAfter time.Duration
	msg        string
}

func (e *pacedError) Error() string { return e.msg }

// paceTicket is a request's place in its site's pace: held in flight from
// its first attempt until it ends (leave).
type paceTicket struct {
	sp       *sitePace
	deadline time.Time // when waiting must end: MaxWait after the first wait
	started  bool      // the deadline is set
}

// pace is the pacing step of tryMembers: before an attempt through h, wait
// for the site's place in flight and for the member's next slot, or take
// another member (alt) that is free sooner. It returns the lease to use;
// an error ends the request (the client left, or the wait would pass
// MaxWait: pacedError), with any lease it took itself given back.
func (g *Gateway) pace(ctx, client context.Context, rq *request, at *attempts, h held) (held, error) {
	p := g.pacer
	if !p.paced(rq.lr.p.Pace) {
		return h, nil
	}
	target := rq.lr.target
	lim, src := p.explicitFor(target, rq.lr.p.Pace)
	now := time.Now()
	p.mu.Lock()
	var learnt rotation.LearntPace
	if p.o.Auto {
		learnt = p.learntFor(p.sites[target], now)
	}
	if lim.IsZero() && !learnt.Slowed() {
		p.mu.Unlock()
		return h, nil
	}
	sp := p.site(target)
	t := &rq.pace
	if !t.started {
		t.deadline, t.started = now.Add(p.o.MaxWait), true
	}
	// A place in flight, once per request.
	if lim.MaxConcurrency > 0 && t.sp == nil {
		if sp.inflight < lim.MaxConcurrency && len(sp.waiters) == 0 {
			sp.inflight++
			t.sp = sp
		} else {
			w := &concWaiter{ready: make(chan struct{})}
			sp.waiters = append(sp.waiters, w)
			sp.queued++
			limit := "site " + target + " allows " + strconv.Itoa(lim.MaxConcurrency) + " requests in flight across the pool (" + concSource(src) + ")"
			sp.lastLimit = limit
			p.mu.Unlock()
			err := g.waitConc(ctx, client, sp, w, t.deadline, limit)
			p.mu.Lock()
			sp.queued--
			if err != nil {
				p.mu.Unlock()
				return h, err
			}
			t.sp = sp
		}
	}
	interval, isrc := lim.MinInterval, src
	if learnt.Interval > interval {
		interval, isrc = learnt.Interval, "learnt after a "+string(learnt.Cause)+" answer at "+learnt.CutAt.UTC().Format(time.TimeOnly)+" (--pacing auto)"
	}
	if interval <= 0 {
		p.mu.Unlock()
		rq.sentAt = time.Now()
		return h, nil
	}
	now = time.Now()
	slot := nextSlot(sp, h.mc.m.Name, interval, now)
	p.mu.Unlock()
	if slot.After(now) && rq.lr.p.Proxy == "" && !rq.lr.p.Strict {
		h, slot = g.soonerMember(ctx, rq, at, h, sp, interval, slot, now)
	}
	limit := "site " + target + ": one request per " + interval.String() + " per member (" + isrc + ")"
	if slot.After(t.deadline) {
		p.mu.Lock()
		sp.refused++
		sp.lastLimit = limit
		p.mu.Unlock()
		return h, &pacedError{retryAfter: time.Until(slot), msg: "paced: " + limit + "; the next slot is in " + time.Until(slot).Round(time.Millisecond).String() + ", past --pacing-max-wait " + p.o.MaxWait.String()}
	}
	if err := p.reserveAndWait(ctx, client, sp, h.mc.m.Name, interval, limit); err != nil {
		return h, err
	}
	rq.sentAt = time.Now()
	return h, nil
}

// nextSlot is member's next free slot at target from now (p.mu held).
func nextSlot(sp *sitePace, member string, interval time.Duration, now time.Time) time.Time {
	if last, ok := sp.members[member]; ok {
		if next := last.Add(interval); next.After(now) {
			return next
		}
	}
	return now
}

func concSource(src string) string {
	if src == "--site-pace" {
		return src
	}
	return "--site-max-concurrency"
}

// waitConc waits for w to be given a place in flight, until deadline.
func (g *Gateway) waitConc(ctx, client context.Context, sp *sitePace, w *concWaiter, deadline time.Time, limit string) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
		err = &pacedError{retryAfter: time.Second, msg: "paced: " + limit + "; no place came free within --pacing-max-wait " + g.pacer.o.MaxWait.String()}
	case <-client.Done():
		err = errClientGone
	case <-ctx.Done():
		if err = context.Cause(ctx); err == nil || errors.Is(err, context.Canceled) {
			err = errClientGone
		}
	}
	p := g.pacer
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.given {
		// Given a place just as the wait ended: it is ours, so use it.
		return nil
	}
	for i, x := range sp.waiters {
		if x == w {
			sp.waiters = append(sp.waiters[:i], sp.waiters[i+1:]...)
			break
		}
	}
	var pe *pacedError
	if errors.As(err, &pe) {
		sp.refused++
	}
	return err
}

// leavePace ends rq's place in flight, handing it to the first waiter.
func (g *Gateway) leavePace(rq *request) {
	sp := rq.pace.sp
	if sp == nil {
		return
	}
	rq.pace.sp = nil
	p := g.pacer
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(sp.waiters) > 0 {
		w := sp.waiters[0]
		sp.waiters = sp.waiters[1:]
		w.given = true
		close(w.ready)
		return
	}
	sp.inflight--
}

// paceAnswered feeds a site's answer to a request sent at rq.sentAt into
// its learnt pace: a ban signal cuts it at once, before the next request
// to the site is paced; any other answer raises it a step.
func (g *Gateway) paceAnswered(rq *request, res rotation.Result) {
	p := g.pacer
	if p == nil || !p.o.Auto || (!res.IsBan() && p.learnt.Load() == 0) {
		return
	}
	now := time.Now()
	sent := rq.sentAt
	if sent.IsZero() {
		sent = now
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !res.IsBan() {
		sp := p.sites[rq.lr.target]
		if sp == nil || !p.learntFor(sp, now).Slowed() {
			return
		}
		if sp.learnt = sp.learnt.Answered(); !sp.learnt.Slowed() {
			p.learnt.Add(-1)
		}
		return
	}
	sp := p.site(rq.lr.target)
	was := p.learntFor(sp, now)
	sp.learnt = sp.learnt.Ban(res, sent, now, sp.struck[rq.member])
	if sp.learnt.Cuts != was.Cuts {
		sp.struck = map[string]bool{}
		g.log.Info("site answered with a ban signal: slowed for the whole pool", "target", rq.lr.target, "answer", string(res), "member", rq.member, "pace", sp.learnt.String())
	}
	if sp.struck == nil {
		sp.struck = map[string]bool{}
	}
	sp.struck[rq.member] = true
	if !was.Slowed() && sp.learnt.Slowed() {
		p.learnt.Add(1)
	}
}

// PaceStatus lists the sites the pacer keeps (those with a pace of some
// kind that had requests), most held first (queued, then waited and
// refused), for the status page and the metrics.
func (g *Gateway) PaceStatus() []status.SitePace {
	p := g.pacer
	now := time.Now()
	p.mu.Lock()
	out := make([]status.SitePace, 0, len(p.sites))
	for site, sp := range p.sites {
		lim, _ := p.explicitFor(site, 0)
		l := p.learntFor(sp, now)
		out = append(out, status.SitePace{
			Site: site, MinIntervalMillis: lim.MinInterval.Milliseconds(), MaxConcurrency: lim.MaxConcurrency,
			LearntIntervalMillis: l.Interval.Milliseconds(), SlowedBy: string(l.Cause), SlowedAt: l.CutAt, Cuts: l.Cuts,
			InFlight: sp.inflight, Queued: sp.queued, Waited: sp.waited, WaitedSeconds: sp.waitedFor.Seconds(), Refused: sp.refused,
			Limit: sp.lastLimit,
		})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b status.SitePace) int {
		return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(b.Waited+b.Refused, a.Waited+a.Refused), cmp.Compare(a.Site, b.Site))
	})
	return out
}

// soonerMember asks the pool for one other member whose slot for the site
// comes before slot, and keeps whichever of the two is free sooner.
func (g *Gateway) soonerMember(ctx context.Context, rq *request, at *attempts, h held, sp *sitePace, interval time.Duration, slot, now time.Time) (held, time.Time) {
	p := g.pacer
	alt, err := g.acquireFresh(ctx, &rq.lr, false)
	if err != nil {
		return h, slot
	}
	p.mu.Lock()
	altSlot := nextSlot(sp, alt.mc.m.Name, interval, now)
	p.mu.Unlock()
	if alt.mc.m.Name != h.mc.m.Name && altSlot.Before(slot) && !at.triedBefore(alt.mc.m.Name) {
		g.done(ctx, h)
		return alt, altSlot
	}
	g.done(ctx, alt)
	return h, slot
}

// reserveAndWait reserves member's next slot for the site and waits for
// it; a request that leaves first gives the slot back when no later one
// reserved behind it.
func (p *pacer) reserveAndWait(ctx, client context.Context, sp *sitePace, member string, interval time.Duration, limit string) error {
	p.mu.Lock()
	prev, had := sp.members[member]
	slot := nextSlot(sp, member, interval, time.Now())
	sp.members[member] = slot
	wait := time.Until(slot)
	if wait > 0 {
		sp.queued++
		sp.waited++
		sp.waitedFor += wait
		sp.lastLimit = limit
	}
	p.mu.Unlock()
	if wait > 0 {
		timer := time.NewTimer(wait)
		var err error
		select {
		case <-timer.C:
		case <-client.Done():
			err = errClientGone
		case <-ctx.Done():
			err = context.Cause(ctx)
			if err == nil || errors.Is(err, context.Canceled) {
				err = errClientGone
			}
		}
		timer.Stop()
		p.mu.Lock()
		sp.queued--
		if err != nil && sp.members[member].Equal(slot) {
			if had {
				sp.members[member] = prev
			} else {
				delete(sp.members, member)
			}
		}
		p.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}
