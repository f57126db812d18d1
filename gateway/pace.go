package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// DefaultPacingMaxWait is how long a request waits for its slot when
// PacingOptions.MaxWait is zero.
const DefaultPacingMaxWait = 30 * time.Second

// maxPaceSites bounds the sites the pacer keeps a view of; past it, sites
// with nothing in flight, nothing queued and nothing learnt are forgotten,
// the next time when the sites kept have doubled since.
const maxPaceSites = 10_000

// slowedRefresh is how often a gateway on a shared pace asks which sites
// the fleet slowed (pool.SitePacer.SlowedSites): the sites it has no limit
// for and would otherwise send to without asking.
const slowedRefresh = time.Second

// Polls for a place in flight freed by another gateway: the first after
// placePollMin, doubling to placePollMax. A place freed here wakes the
// waiters at once.
const (
	placePollMin = 20 * time.Millisecond
	placePollMax = 250 * time.Millisecond
)

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
	// Rule is what a site's first ban teaches the pool under Auto
	// (--pacing-window, --pacing-increase-steps, --pacing-memory); the
	// zero value is the fixed first cut (rotation.PaceFirstCut, no pause,
	// forgotten after rotation.PaceQuiet) and logs no evidence.
	Rule rotation.PaceRule
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

// pacer is a gateway's side of pacing. The decisions (a member's next
// slot, a place in flight, the learnt pace) are the store's
// (pool.SitePacer): the pool's own when it keeps a pace, so every gateway
// and controller replica on one lease store paces a site together, else
// one in this process. The pacer keeps what only this gateway needs: a
// view of each paced site (its learnt pace as the store last told it, the
// requests waiting here, counters for the status page). A site with no
// limit and no learnt pace never reaches the store: with no limit
// configured and no site slowed, a request costs two loads.
//
// pacer is the pacing stage of the request path: before each attempt a
// request waits here for its site's place in flight and its member's next
// slot (pace), leaves its place when it ends (leave), and the site's
// answers feed the learnt pace (answered). It calls the leasing stage
// (paceLeases) only for a member free sooner.
type pacer struct {
	o        PacingOptions
	explicit bool         // a limit is configured for some site
	learnt   atomic.Int64 // sites slowed in the view now
	store    pool.SitePacer
	own      *pool.Paces // this process's pace: the store when no other is given, the fallback while it fails
	log      *slog.Logger
	leases   paceLeases         // for a member free sooner (soonerMember)
	evidence *evidenceLog       // what a first ban is judged by; nil without a rule
	stop     context.CancelFunc // ends the refresh of slowed sites; nil when there is none
	// givingBack counts the give-backs in flight (giveBackLater).
	givingBack atomic.Int32

	mu      sync.Mutex
	sites   map[string]*sitePace
	sweepAt int // sites kept at which the next sweep comes (at least maxPaceSites)
	sweeps  int // sweeps made (tests)
}

// paceLeases is what pacing asks of the leasing stage: another member for
// a request whose member's slot is far off, and the one of the two given
// back.
type paceLeases interface {
	acquireFresh(ctx context.Context, lr leaseReq, pin bool) (held, error)
	done(ctx context.Context, h held)
}

// newPacer makes the pacer on store (nil: a pace of its own). A store not
// in this process is asked every slowedRefresh which sites the fleet
// slowed, until close.
func newPacer(o PacingOptions, store pool.SitePacer, leases paceLeases, log *slog.Logger) *pacer {
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultPacingMaxWait
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &pacer{o: o, leases: leases, explicit: !o.Default.IsZero() || !o.Sites.t.empty(), own: pool.NewPaces(nil), log: log, sites: map[string]*sitePace{}}
	if o.Auto {
		p.evidence = newEvidenceLog(o.Rule.Window)
	}
	p.store = store
	switch store.(type) {
	case nil:
		p.store = p.own
	case *pool.Store, *pool.Paces:
	default:
		if o.Auto {
			ctx, cancel := context.WithCancel(context.Background())
			p.stop = cancel
			go p.refreshSlowed(ctx)
		}
	}
	return p
}

// close ends the refresh of slowed sites.
func (p *pacer) close() {
	if p.stop != nil {
		p.stop()
	}
}

// sitePace is this gateway's view of one paced site, guarded by pacer.mu.
type sitePace struct {
	// learnt is the site's learnt pace as the store last told it.
	learnt   rotation.LearntPace
	inflight int           // places in flight held by requests here
	wake     chan struct{} // closed (and replaced) when a place here is given back
	queued   int
	// counters for the status page and metrics
	waited    uint64
	waitedFor time.Duration
	refused   uint64
	lastLimit string // the limit that held the last waiting request
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

// site returns target's view, making it; p.mu is held.
func (p *pacer) site(target string) *sitePace {
	sp := p.sites[target]
	if sp == nil {
		if len(p.sites) >= max(p.sweepAt, maxPaceSites) {
			p.sweep()
		}
		sp = &sitePace{wake: make(chan struct{})}
		p.sites[target] = sp
	}
	return sp
}

// sweep forgets the sites with nothing in flight, waiting or learnt. The
// next sweep comes when the sites kept have doubled since, so a sweep that
// frees little (the fleet slowed thousands of sites) costs O(1) per new
// site, not a pass over them all at each.
func (p *pacer) sweep() {
	p.sweeps++
	now := time.Now()
	for k, sp := range p.sites {
		if sp.inflight == 0 && sp.queued == 0 && !sp.learnt.Decayed(now).Slowed() {
			p.setLearnt(sp, rotation.LearntPace{}) // a decayed one leaves the count
			delete(p.sites, k)
		}
	}
	p.sweepAt = 2 * len(p.sites)
}

// learntFor is target's learnt pace in the view now (p.mu held).
func (p *pacer) learntFor(sp *sitePace, now time.Time) rotation.LearntPace {
	if sp == nil {
		return rotation.LearntPace{}
	}
	// A store in another process decays a pace by its own clock, which
	// its cut time is on: the view of it ends when the store's list of
	// slowed sites drops it (refreshSlowed) or a decision of the store
	// says so, never by this gateway's clock.
	if sp.learnt.Slowed() && p.stop == nil && !sp.learnt.Decayed(now).Slowed() {
		p.setLearnt(sp, rotation.LearntPace{})
	}
	return sp.learnt
}

// setLearnt puts what the store said of a site's learnt pace into the
// view (p.mu held), keeping the count of slowed sites.
func (p *pacer) setLearnt(sp *sitePace, l rotation.LearntPace) {
	if was := sp.learnt.Slowed(); was != l.Slowed() {
		if was {
			p.learnt.Add(-1)
		} else {
			p.learnt.Add(1)
		}
	}
	sp.learnt = l
}

// refreshSlowed asks the store every slowedRefresh which sites the fleet
// slowed, so this gateway asks the store before sending to them too, and
// forgets the slow-downs the fleet ended.
func (p *pacer) refreshSlowed(ctx context.Context) {
	t := time.NewTicker(slowedRefresh)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, slowedRefresh)
		sites, err := p.store.SlowedSites(rctx)
		cancel()
		if err == nil {
			p.applySlowed(sites, time.Now())
		} else if ctx.Err() == nil {
			p.log.Debug("pacing: reading the fleet's slowed sites failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// applySlowed makes the view's slowed sites the fleet's: a site slowed
// elsewhere enters it (its pace as the store will tell at its next
// request; until then at the first cut), one the fleet no longer slows
// leaves it.
func (p *pacer) applySlowed(sites []string, now time.Time) {
	in := make(map[string]bool, len(sites))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, site := range sites {
		in[site] = true
		if sp := p.site(site); !sp.learnt.Slowed() {
			p.setLearnt(sp, rotation.LearntPace{Interval: rotation.PaceFirstCut, CutInterval: rotation.PaceFirstCut, CutAt: now})
		}
	}
	for site, sp := range p.sites {
		if !in[site] && sp.learnt.Slowed() {
			p.setLearnt(sp, rotation.LearntPace{})
		}
	}
}

// slowedElsewhere is the status page's "slowed by" of a site this gateway
// knows as slowed only from the store's list (SlowedSites).
const slowedElsewhere = "another gateway (the store's pace)"

// pacedError is a request that could not get its slot within MaxWait.
type pacedError struct {
	retryAfter time.Duration
	msg        string
}

func (e *pacedError) Error() string { return e.msg }

// paceTicket is a request's place in its site's pace: held in flight from
// its first attempt until it ends (leave).
type paceTicket struct {
	sp       *sitePace      // the site's view, while the request holds a place in flight
	placeBy  pool.SitePacer // where the place is held
	holder   string         // the place's id
	deadline time.Time      // when waiting must end: MaxWait after the first wait, or due
	started  bool           // the deadline is set
	due      time.Time      // the request's own deadline (--request-timeout, plain HTTP); zero for none
	dueHeld  bool           // due, not MaxWait, set deadline
	trail    bool           // the gateway sees the request's answer: it trails the site's leader before the first ban (evidenceLog.trail)
	cuts     int            // the learnt pace's cuts the last attempt was paced under
}

// pace is the pacing step of tryMembers: before an attempt through h, wait
// for the site's place in flight and for the member's next slot, or take
// another member (alt) that is free sooner. It returns the lease to use;
// an error ends the request (the client left, or the wait would pass
// MaxWait: pacedError), with any lease it took itself given back.
func (p *pacer) pace(ctx, client context.Context, rq *request, at *attempts, h held) (held, error) {
	if rq.pace.trail && p != nil && p.evidence != nil {
		// A site with a pace of the operator's or the client's is known:
		// it is paced as told, not trailed (and a request that takes a
		// member free sooner would leave its count on the first).
		if lim, _ := p.explicitFor(rq.lr.target, rq.lr.p.Pace); lim.IsZero() {
			if err := p.trail(ctx, client, rq.lr.target, h.mc.m.Name); err != nil {
				return h, err
			}
		}
	}
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
	p.mu.Unlock()
	t := &rq.pace
	if !t.started {
		t.deadline, t.started = now.Add(p.o.MaxWait), true
		if !t.due.IsZero() && t.due.Before(t.deadline) {
			// A wait past the request's own deadline could only end in
			// a 504: the slot is refused at once, 503 paced.
			t.deadline, t.dueHeld = t.due, true
		}
	}
	t.cuts = learnt.Cuts
	if lim.MaxConcurrency > 0 && t.sp == nil {
		limit := "site " + target + " allows " + strconv.Itoa(lim.MaxConcurrency) + " requests in flight across the pool (" + concSource(src) + ")"
		if err := p.waitPlace(ctx, client, rq, sp, lim.MaxConcurrency, limit); err != nil {
			return h, err
		}
	}
	if lim.MinInterval <= 0 && !learnt.Slowed() {
		rq.sentAt = time.Now()
		return h, nil
	}
	req := pool.SlotRequest{Site: target, Member: h.mc.m.Name, MinInterval: lim.MinInterval, Auto: p.o.Auto, MaxWait: time.Until(t.deadline)}
	slot, by := p.reserve(ctx, req, sp)
	if slot.Interval <= 0 {
		rq.sentAt = time.Now()
		return h, nil
	}
	if slot.Wait > time.Millisecond && rq.lr.p.Proxy == "" && !rq.lr.p.Strict {
		h, slot, by = p.soonerMember(ctx, rq, at, h, sp, req, slot, by)
	}
	if req.Auto {
		// The cut the request goes out under is the store's, as it set
		// the slot: the view's may be older (cut since by another
		// gateway, or known only from the list of slowed sites), and a
		// ban to the request would pass for one in flight at the cut.
		t.cuts = slot.Learnt.Cuts
	}
	isrc := src
	if slot.Learnt.Interval > lim.MinInterval {
		isrc = "learnt after a " + string(slot.Learnt.Cause) + " answer at " + slot.Learnt.CutAt.UTC().Format(time.TimeOnly) + " (--pacing auto)"
	}
	limit := "site " + target + ": one request per " + slot.Interval.String() + " per member (" + isrc + ")"
	if !slot.Reserved {
		p.mu.Lock()
		sp.refused++
		sp.lastLimit = limit
		p.mu.Unlock()
		return h, &pacedError{retryAfter: slot.Wait, msg: "paced: " + limit + "; the next slot is in " + slot.Wait.Round(time.Millisecond).String() + ", past " + p.waitBound(t)}
	}
	if err := p.waitSlot(ctx, client, sp, target, h.mc.m.Name, slot, by, limit); err != nil {
		return h, err
	}
	rq.sentAt = time.Now()
	return h, nil
}

// attemptFailed tells the trail that rq's attempt ended without an
// answer, so it no longer counts in flight for its member.
func (p *pacer) attemptFailed(rq *request) {
	if p != nil && rq.pace.trail && p.evidence != nil {
		p.evidence.unserved(rq.lr.target, rq.member, time.Now())
	}
}

// trail holds a request to a site not slowed behind the site's leader
// (evidenceLog.trail) until the site has served the leader more than the
// member has sent, the site is slowed (its pace then holds the request),
// or the lead comes to the member. It waits at most MaxWait, then sends.
func (p *pacer) trail(ctx, client context.Context, target, member string) error {
	var timer *time.Timer
	for {
		if p.learnt.Load() > 0 {
			p.mu.Lock()
			slowed := p.learntFor(p.sites[target], time.Now()).Slowed()
			p.mu.Unlock()
			if slowed {
				return nil
			}
		}
		ok, wake := p.evidence.trail(target, member, time.Now())
		if ok {
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(p.o.MaxWait)
			defer timer.Stop()
		}
		takeover := time.NewTimer(trailTakeover)
		select {
		case <-wake:
		case <-takeover.C:
		case <-timer.C:
			takeover.Stop()
			return nil
		case <-client.Done():
			takeover.Stop()
			return errClientGone
		case <-ctx.Done():
			takeover.Stop()
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return errClientGone
		}
		takeover.Stop()
	}
}

// reserve asks the store for req's slot, falling back to the gateway's own
// pace while the store fails (pacing goes on, per gateway, through an
// outage). It puts the learnt pace the store told into the view, and
// returns who holds the slot.
func (p *pacer) reserve(ctx context.Context, req pool.SlotRequest, sp *sitePace) (pool.Slot, pool.SitePacer) {
	by := p.store
	slot, err := by.ReserveSlot(ctx, req)
	if err != nil {
		p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", req.Site, "err", err)
		by = p.own
		slot, _ = by.ReserveSlot(ctx, req)
	}
	if req.Auto {
		p.mu.Lock()
		p.setLearnt(sp, slot.Learnt)
		p.mu.Unlock()
	}
	return slot, by
}

// waitBound names what ended t's wait: --pacing-max-wait, or the
// request's own deadline.
func (p *pacer) waitBound(t *paceTicket) string {
	if t.dueHeld {
		return "the request's deadline (--request-timeout)"
	}
	return "--pacing-max-wait " + p.o.MaxWait.String()
}

func concSource(src string) string {
	if src == "--site-pace" {
		return src
	}
	return "--site-max-concurrency"
}

// newHolder is a fresh id for a place in flight.
func newHolder() string { return rand.Text() }

// waitPlace takes a place among the site's requests in flight, waiting
// for one until the request's deadline: woken when a request here leaves,
// and asking the store again now and then for a place another gateway
// gave back.
func (p *pacer) waitPlace(ctx, client context.Context, rq *request, sp *sitePace, limit int, why string) error {
	t := &rq.pace
	holder := newHolder()
	target := rq.lr.target
	timer := time.NewTimer(time.Until(t.deadline))
	defer timer.Stop()
	poll := placePollMin
	queued := false
	defer func() {
		if queued {
			p.mu.Lock()
			sp.queued--
			p.mu.Unlock()
		}
	}()
	for {
		p.mu.Lock()
		wake := sp.wake
		p.mu.Unlock()
		by := p.store
		in, err := by.EnterSite(ctx, target, holder, limit)
		if err != nil {
			p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", target, "err", err)
			// The store may have taken the place before the call failed
			// (its answer lost, this request's context ended mid-call):
			// give it back, or the site counts it in flight for
			// pool.PaceHold. A fresh holder goes on, so the give-back
			// never takes a place a later call got.
			p.giveBackLater(target, holder)
			holder = newHolder()
			by = p.own
			in, _ = by.EnterSite(ctx, target, holder, limit)
		}
		if in {
			p.mu.Lock()
			sp.inflight++
			p.mu.Unlock()
			t.sp, t.placeBy, t.holder = sp, by, holder
			return nil
		}
		if !queued {
			queued = true
			p.mu.Lock()
			sp.queued++
			sp.lastLimit = why
			p.mu.Unlock()
		}
		pollT := time.NewTimer(poll)
		poll = min(2*poll, placePollMax)
		select {
		case <-wake:
		case <-pollT.C:
		case <-timer.C:
			pollT.Stop()
			p.mu.Lock()
			sp.refused++
			p.mu.Unlock()
			return &pacedError{retryAfter: time.Second, msg: "paced: " + why + "; no place came free within " + p.waitBound(t)}
		case <-client.Done():
			pollT.Stop()
			return errClientGone
		case <-ctx.Done():
			pollT.Stop()
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return errClientGone
		}
		pollT.Stop()
	}
}

// maxGivingBack bounds the give-backs (giveBackLater) in flight at once:
// while the store is down every request with a place to wait for fails
// one, and past it a place is left to expire after pool.PaceHold rather
// than pile up calls on a store that does not answer.
const maxGivingBack = 64

// giveBackLater leaves, in the background, a place the store may hold for
// holder after a call that failed; a failure (or too many give-backs at
// once) leaves it to expire after pool.PaceHold.
func (p *pacer) giveBackLater(site, holder string) {
	if p.givingBack.Add(1) > maxGivingBack {
		p.givingBack.Add(-1)
		return
	}
	go func() {
		defer p.givingBack.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), poolCallTimeout)
		defer cancel()
		if err := p.store.LeaveSite(ctx, site, holder); err != nil {
			p.log.Debug("pacing: giving back a place a failed call may have taken failed; it counts until it expires", "site", site, "err", err)
		}
	}()
}

// leavePace ends rq's place in flight (when it holds one) at pl, the
// pacing stage. The ticket is handed over by value: a request the stages
// only read stays on its handler's stack (a pointer into it through an
// interface would move every request to the heap).
func (rq *request) leavePace(pl placeLeaver) {
	if rq.pace.sp == nil {
		return
	}
	t := rq.pace
	rq.pace.sp = nil
	pl.leave(t, rq.lr.target)
}

// leave ends the place in flight t holds at site and wakes the requests
// waiting here for one.
func (p *pacer) leave(t paceTicket, site string) {
	sp := t.sp
	if sp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), poolCallTimeout)
	defer cancel()
	if err := t.placeBy.LeaveSite(ctx, site, t.holder); err != nil {
		p.log.Warn("pacing: giving a place in flight back failed; it counts until it expires", "site", site, "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sp.inflight--
	close(sp.wake)
	sp.wake = make(chan struct{})
}

// answered feeds a site's answer into its learnt pace: a ban signal
// cuts it at once, before the next request to the site is paced; any
// other answer raises it a step. Answers of a site the view does not
// know as slowed cost nothing.
func (p *pacer) answered(rq *request, res rotation.Result) {
	if p == nil || !p.o.Auto {
		return
	}
	target := rq.lr.target
	if !res.IsBan() {
		if p.evidence != nil {
			p.evidence.served(target, rq.member, time.Now())
		}
		if p.learnt.Load() == 0 {
			return
		}
	}
	now := time.Now()
	if res.IsBan() {
		defer p.evidence.unserved(target, rq.member, now)
	}
	p.mu.Lock()
	sp := p.sites[target]
	was := p.learntFor(sp, now)
	p.mu.Unlock()
	if !res.IsBan() && !was.Slowed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), poolCallTimeout)
	defer cancel()
	a := pool.SiteAnswer{Site: target, Member: rq.member, Result: res, SeenCuts: rq.pace.cuts}
	if res.IsBan() {
		a.FirstCut = p.o.Rule.FirstCut(p.evidence.evidence(target, rq.member, now))
	}
	l, err := p.store.SiteAnswered(ctx, a)
	if err != nil {
		p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", target, "err", err)
		l, _ = p.own.SiteAnswered(ctx, a)
	}
	p.mu.Lock()
	if sp == nil {
		sp = p.site(target)
	}
	p.setLearnt(sp, l)
	p.mu.Unlock()
	if l.Cuts > was.Cuts || (l.Slowed() && !was.Slowed()) {
		p.log.Info("site answered with a ban signal: slowed for the whole pool", "target", target, "answer", string(res), "member", rq.member, "pace", l.String())
	}
}

// status lists the sites the pacer keeps (those with a pace of some
// kind that had requests), most held first (queued, then waited and
// refused), for the status page and the metrics. The learnt pace is as
// the store last told this gateway; the counts are this gateway's.
func (p *pacer) status() []statuspage.SitePace {
	now := time.Now()
	p.mu.Lock()
	out := make([]statuspage.SitePace, 0, len(p.sites))
	for site, sp := range p.sites {
		lim, _ := p.explicitFor(site, 0)
		l := p.learntFor(sp, now)
		by := string(l.Cause)
		if by == "" && l.Slowed() {
			// Known from the store's list of slowed sites only: the cut
			// was another gateway's, its pace told at this one's next request.
			by = slowedElsewhere
		}
		out = append(out, statuspage.SitePace{
			Site: site, MinIntervalMillis: lim.MinInterval.Milliseconds(), MaxConcurrency: lim.MaxConcurrency,
			LearntIntervalMillis: l.Interval.Milliseconds(), SlowedBy: by, SlowedAt: l.CutAt, Cuts: l.Cuts,
			InFlight: sp.inflight, Queued: sp.queued, Waited: sp.waited, WaitedSeconds: sp.waitedFor.Seconds(), Refused: sp.refused,
			Limit: sp.lastLimit,
		})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b statuspage.SitePace) int {
		return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(b.Waited+b.Refused, a.Waited+a.Refused), cmp.Compare(a.Site, b.Site))
	})
	return out
}

// soonerMember asks the pool for one other member and reserves its slot
// for the site when it comes before slot (and within the wait allowed),
// keeping whichever of the two is free sooner; the other's slot and lease
// are given back.
func (p *pacer) soonerMember(ctx context.Context, rq *request, at *attempts, h held, sp *sitePace, req pool.SlotRequest, slot pool.Slot, by pool.SitePacer) (held, pool.Slot, pool.SitePacer) {
	alt, err := p.leases.acquireFresh(ctx, rq.lr, false)
	if err != nil {
		return h, slot, by
	}
	if alt.mc.m.Name == h.mc.m.Name || at.triedBefore(alt.mc.m.Name) {
		p.leases.done(ctx, alt)
		return h, slot, by
	}
	areq := req
	areq.Member = alt.mc.m.Name
	areq.MaxWait = min(req.MaxWait, slot.Wait-time.Millisecond)
	aslot, aby := p.reserve(ctx, areq, sp)
	if !aslot.Reserved || aslot.Wait >= slot.Wait {
		p.leases.done(ctx, alt)
		return h, slot, by
	}
	if slot.Reserved {
		_ = by.ReturnSlot(ctx, req.Site, req.Member, slot.Token)
	}
	p.leases.done(ctx, h)
	return alt, aslot, aby
}

// waitSlot waits for a reserved slot; a request that leaves first gives
// the slot back (unless a later one reserved behind it).
func (p *pacer) waitSlot(ctx, client context.Context, sp *sitePace, site, member string, slot pool.Slot, by pool.SitePacer, limit string) error {
	if slot.Wait <= 0 {
		return nil
	}
	p.mu.Lock()
	sp.queued++
	sp.waited++
	sp.waitedFor += slot.Wait
	sp.lastLimit = limit
	p.mu.Unlock()
	timer := time.NewTimer(slot.Wait)
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
	p.mu.Unlock()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), poolCallTimeout)
		_ = by.ReturnSlot(rctx, site, member, slot.Token)
		cancel()
	}
	return err
}
