// Package pacing is the gateway's pacing stage: when a request may be
// sent to a site. Before each attempt a request waits here for its site's
// place in flight and its member's next slot, or takes another member free
// sooner (Move), or ends 503 paced (Error); its site's answers feed the
// learnt pace (Answered), and it gives its place back when it ends
// (Leave). The rules (a site's limits, the learnt pace, the first cut) are
// rotation's; the decisions shared by a fleet are the store's
// (pool.SitePacer); this package keeps what one gateway needs between
// them. It knows nothing of the gateway's request types: a request holds
// a Ticket and describes each attempt as an Attempt.
package pacing

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

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

// Pacer is a gateway's side of pacing. The decisions (a member's next
// slot, a place in flight, the learnt pace) are the store's
// (pool.SitePacer): the pool's own when it keeps a pace, so every gateway
// and controller replica on one lease store paces a site together, else
// one in this process. The Pacer keeps what only this gateway needs: a
// view of each paced site (its learnt pace as the store last told it, the
// requests waiting here, counters for the status page). A site with no
// limit and no learnt pace never reaches the store: with no limit
// configured and no site slowed, a request costs two loads.
//
// It calls no other stage: a request that may take another member free
// sooner hands it the leasing stage's side of that (Move).
type Pacer struct {
	o        Options
	explicit bool         // a limit is configured for some site
	learnt   atomic.Int64 // sites slowed in the view now
	store    pool.SitePacer
	own      *pool.Paces // this process's pace: the store when no other is given, the fallback while it fails
	// alone says the store is this process's (no other gateway paces
	// on it, so the evidence log sees every trailed send through the
	// members: rotation.BanEvidence.OthersKnown).
	alone    bool
	log      *slog.Logger
	evidence *evidenceLog       // what a first ban is judged by; nil without a rule
	stop     context.CancelFunc // ends the refresh of slowed sites; nil when there is none
	// givingBack counts the give-backs in flight (giveBackLater).
	givingBack atomic.Int32

	mu      sync.Mutex
	sites   map[string]*sitePace
	sweepAt int // sites kept at which the next sweep comes (at least maxPaceSites)
	sweeps  int // sweeps made (tests)
}

// New makes the pacer on store (nil: a pace of its own). A store not in
// this process is asked every slowedRefresh which sites the fleet slowed,
// until Close.
func New(o Options, store pool.SitePacer, log *slog.Logger) *Pacer {
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pacer{o: o, explicit: !o.Default.IsZero() || !o.Sites.t.Empty(), own: pool.NewPaces(nil), log: log, sites: map[string]*sitePace{}}
	if o.Auto {
		p.evidence = newEvidenceLog(o.Rule.Window)
	}
	p.store = store
	switch store.(type) {
	case nil:
		p.store, p.alone = p.own, true
	case *pool.Store, *pool.Paces:
		p.alone = true
	default:
		if o.Auto {
			ctx, cancel := context.WithCancel(context.Background())
			p.stop = cancel
			go p.refreshSlowed(ctx)
		}
	}
	return p
}

// Close ends the refresh of slowed sites.
func (p *Pacer) Close() {
	if p.stop != nil {
		p.stop()
	}
}

// sitePace is this gateway's view of one paced site, guarded by Pacer.mu.
type sitePace struct {
	// learnt is the site's learnt pace as the store last told it.
	learnt rotation.LearntPace
	// banned is the members this site refused with a ban signal, and
	// until when a request leased on one before its ban is moved off it
	// (moveOff); nil while none is.
	banned   map[string]time.Time
	inflight int           // places in flight held by requests here
	wake     chan struct{} // closed (and replaced) when a place here is given back
	queued   int
	// counters for the status page and metrics
	waited    uint64
	waitedFor time.Duration
	refused   uint64
	lastLimit string // the limit that held the last waiting request
}

// explicitFor is the operator's pace for target, met with the client's
// own: the options' alone, so a value of Options, not of the Pacer.
func (o Options) explicitFor(target string, client time.Duration) (lim rotation.PaceLimits, src string) {
	lim, src = o.Default, "--site-min-interval"
	if l, ok := o.Sites.For(target); ok {
		lim, src = l, "--site-pace"
	}
	if client > lim.MinInterval {
		lim.MinInterval, src = client, "the client's pace"
	}
	return lim, src
}

// paced reports whether target may need pacing at all; false is the fast
// path of every site without limits.
func (p *Pacer) paced(client time.Duration) bool {
	return p != nil && (p.explicit || client > 0 || p.learnt.Load() > 0)
}

// site returns target's view, making it; p.mu is held.
func (p *Pacer) site(target string) *sitePace {
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
func (p *Pacer) sweep() {
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
func (p *Pacer) learntFor(sp *sitePace, now time.Time) rotation.LearntPace {
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
func (p *Pacer) setLearnt(sp *sitePace, l rotation.LearntPace) {
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
func (p *Pacer) refreshSlowed(ctx context.Context) {
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
func (p *Pacer) applySlowed(sites []string, now time.Time) {
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

// Status lists the sites the pacer keeps (those with a pace of some
// kind that had requests), most held first (queued, then waited and
// refused), for the status page and the metrics. The learnt pace is as
// the store last told this gateway; the counts are this gateway's.
func (p *Pacer) Status() []statuspage.SitePace {
	now := time.Now()
	p.mu.Lock()
	out := make([]statuspage.SitePace, 0, len(p.sites))
	for site, sp := range p.sites {
		lim, _ := p.o.explicitFor(site, 0)
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
