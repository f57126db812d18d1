package pool

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// PaceHold is how long a place in a site's flight (EnterSite) counts when
// its holder never leaves: a gateway that crashed gives its places back
// after it. A request in flight longer than this stops counting.
const PaceHold = 10 * time.Minute

// maxPaceSites bounds the sites a Paces keeps; past it, sites with nothing
// in flight, no slot ahead and nothing learnt are forgotten, the next time
// when the sites kept have doubled since (at most twice the busy ones).
const maxPaceSites = 10_000

// SitePacer keeps the pace of sites where the leases are kept, so that
// every gateway and controller replica on one lease store paces a site
// together: each (member, site)'s next slot, the requests in flight per
// site and the learnt pace (rotation.LearntPace). Every method is one
// atomic decision on the store (one script on Redis). A gateway calls it
// only for a site that has a limit of some kind; a site without one never
// costs a call. *Store (through Paces), the Redis store and the lease API
// client implement it.
type SitePacer interface {
	// ReserveSlot reserves the next slot of req.Member at req.Site, the
	// interval being the longer of req.MinInterval and (with req.Auto)
	// the site's learnt pace. No interval is no reservation (Slot.Interval
	// 0, Wait 0); a slot further than req.MaxWait away is not taken
	// (Reserved false, Wait says when it would be).
	ReserveSlot(ctx context.Context, req SlotRequest) (Slot, error)
	// ReturnSlot gives back a reserved slot whose request left before
	// using it, unless a later request reserved behind it: the member's
	// slot before it is its last again. A slot whose predecessor is not
	// known (the member's first, or one returned to already) stays taken.
	ReturnSlot(ctx context.Context, site, member string, token int64) error
	// EnterSite takes a place among site's requests in flight for holder
	// (a unique id per request) when fewer than limit are: true when it
	// did. A place lasts until LeaveSite, at most PaceHold.
	EnterSite(ctx context.Context, site, holder string, limit int) (bool, error)
	// LeaveSite gives holder's place back; an unknown holder is fine.
	LeaveSite(ctx context.Context, site, holder string) error
	// SiteAnswered feeds one answer of a site into its learnt pace (a ban
	// signal cuts it, any other answer raises it a step) and returns the
	// pace after it.
	SiteAnswered(ctx context.Context, a SiteAnswer) (rotation.LearntPace, error)
	// SlowedSites lists the sites with a learnt pace now: what a gateway
	// needs to know to pace a site it has no limit for.
	SlowedSites(ctx context.Context) ([]string, error)
}

// SlotRequest asks for a request's slot at a site through one member.
type SlotRequest struct {
	// Site is the target (rotation.TargetKey), Member the member's name.
	Site, Member string
	// MinInterval is the explicit interval (the operator's, or the
	// client's stricter one); 0 is none.
	MinInterval time.Duration
	// Auto applies the site's learnt pace too (--pacing auto).
	Auto bool
	// MaxWait is the furthest slot the request takes (0: only one free now).
	MaxWait time.Duration
}

// Slot is ReserveSlot's answer.
type Slot struct {
	// Wait is how long until the slot, on the store's clock.
	Wait time.Duration
	// Reserved says the slot is the request's: it goes after Wait.
	Reserved bool
	// Interval is the interval that set the slot; 0 is no pace at all.
	Interval time.Duration
	// Learnt is the site's learnt pace now (zero when none, or not Auto).
	Learnt rotation.LearntPace
	// Token names the reservation for ReturnSlot.
	Token int64
}

// SiteAnswer is one answer of a site, for SiteAnswered.
type SiteAnswer struct {
	// Site is the target, Member the member the answer came through.
	Site, Member string
	// Result is the answer's classification; a ban signal cuts the pace.
	Result rotation.Result
	// SeenCuts is the site's LearntPace.Cuts the request was paced under
	// (0 when it was not): a ban to a request paced under an older cut was
	// in flight when the site was cut, and is no news.
	SeenCuts int
	// FirstCut is what a ban sets when the site is not slowed
	// (rotation.PaceRule.FirstCut from the gateway's evidence); the zero
	// value is the fixed first cut. On a slowed site its Pause is the
	// least a later cut pauses for (rotation.LearntPace.BanWith).
	FirstCut rotation.Cut
}

// BanSent maps SeenCuts to the send time rotation.LearntPace.Ban wants:
// before the last cut when the request was paced under an older one, now
// otherwise. Every SitePacer uses it, so the clocks of the gateways never
// meet the store's.
func BanSent(p rotation.LearntPace, seenCuts int, now time.Time) time.Time {
	if p.Slowed() && seenCuts < p.Cuts {
		return p.CutAt.Add(-time.Nanosecond)
	}
	return now
}

// Paces is the in-process SitePacer: the pace of the sites one process
// sees, behind one mutex. The memory Store keeps one; a gateway on a
// lease API or store without a pace of its own makes one.
type Paces struct {
	clock clock.PassiveClock

	mu      sync.Mutex
	sites   map[string]*paceSite
	sweepAt int // sites kept at which the next sweep comes (at least maxPaceSites)
	sweeps  int // sweeps made (tests)
}

type paceSite struct {
	learnt  rotation.LearntPace
	struck  map[string]bool // members banned by the site since its last cut
	slots   map[string]slotState
	holders map[string]time.Time // place in flight -> when it stops counting
}

type slotState struct {
	at, prev time.Time
	had      bool // prev is known: the slot reserved before at
}

// NewPaces makes an empty Paces on c (nil: the real clock).
func NewPaces(c clock.PassiveClock) *Paces {
	if c == nil {
		c = clock.RealClock{}
	}
	return &Paces{clock: c, sites: map[string]*paceSite{}}
}

// site returns site's state, making it (p.mu held).
func (p *Paces) site(site string, now time.Time) *paceSite {
	ps := p.sites[site]
	if ps == nil {
		if len(p.sites) >= max(p.sweepAt, maxPaceSites) {
			p.sweep(now)
		}
		ps = &paceSite{slots: map[string]slotState{}, holders: map[string]time.Time{}}
		p.sites[site] = ps
	}
	return ps
}

// sweep forgets the sites with nothing in flight, ahead or learnt.
// The next sweep comes when the sites kept have doubled since, so a
// sweep that frees little (every site busy) costs O(1) per new site, not
// a pass over them all at each.
func (p *Paces) sweep(now time.Time) {
	p.sweeps++
	for k, ps := range p.sites {
		if !ps.busy(now) {
			delete(p.sites, k)
		}
	}
	p.forgetLeast(now)
	p.sweepAt = 2 * len(p.sites)
}

// forgetLeast bounds what is remembered: past maxPaceSites, the learnt
// paces of sites with nothing in flight and no slot ahead are forgotten,
// those that matter least first (fewest cuts, then the oldest cut), down
// to half the bound. A site busy now is never forgotten.
func (p *Paces) forgetLeast(now time.Time) {
	if len(p.sites) < maxPaceSites {
		return
	}
	type cand struct {
		site string
		l    rotation.LearntPace
	}
	var idle []cand
	for k, ps := range p.sites {
		if !ps.inUse(now) {
			idle = append(idle, cand{k, ps.learnt})
		}
	}
	slices.SortFunc(idle, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.l.Cuts, b.l.Cuts), a.l.CutAt.Compare(b.l.CutAt))
	})
	for _, c := range idle {
		if len(p.sites) <= maxPaceSites/2 {
			break
		}
		delete(p.sites, c.site)
	}
}

func (ps *paceSite) busy(now time.Time) bool {
	return ps.learnt.Decayed(now).Slowed() || ps.inUse(now)
}

// inUse reports whether ps has a place in flight or a slot ahead.
func (ps *paceSite) inUse(now time.Time) bool {
	for _, until := range ps.holders {
		if now.Before(until) {
			return true
		}
	}
	for _, s := range ps.slots {
		if s.at.After(now) {
			return true
		}
	}
	return false
}

// learntNow is ps's learnt pace decayed to now (p.mu held).
func (ps *paceSite) learntNow(now time.Time) rotation.LearntPace {
	if ps.learnt.Slowed() {
		if ps.learnt = ps.learnt.Decayed(now); !ps.learnt.Slowed() {
			ps.struck = nil
		}
	}
	return ps.learnt
}

// ReserveSlot is SitePacer.ReserveSlot.
func (p *Paces) ReserveSlot(_ context.Context, req SlotRequest) (Slot, error) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.sites[req.Site]
	var out Slot
	if req.Auto && ps != nil {
		out.Learnt = ps.learntNow(now)
	}
	out.Interval = max(req.MinInterval, out.Learnt.Interval)
	if out.Interval <= 0 {
		return out, nil
	}
	if ps == nil {
		ps = p.site(req.Site, now)
	}
	prev, had := ps.slots[req.Member]
	at := now
	if until := out.Learnt.PausedUntil(); until.After(at) {
		// The cut paused the whole site: no member's slot before its end.
		at = until
	}
	if had {
		if next := prev.at.Add(out.Interval); next.After(at) {
			at = next
		}
	}
	out.Wait = at.Sub(now)
	if out.Wait > max(req.MaxWait, 0) {
		return out, nil
	}
	ps.slots[req.Member] = slotState{at: at, prev: prev.at, had: had}
	out.Reserved, out.Token = true, at.UnixNano()
	return out, nil
}

// ReturnSlot is SitePacer.ReturnSlot.
func (p *Paces) ReturnSlot(_ context.Context, site, member string, token int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.sites[site]
	if ps == nil {
		return nil
	}
	s, ok := ps.slots[member]
	if !ok || s.at.UnixNano() != token {
		return nil
	}
	if s.had {
		// The slot before it is the last again; the one before that is
		// not known, so a second return keeps it (a slot wasted, never
		// two requests closer than the interval).
		ps.slots[member] = slotState{at: s.prev}
	}
	return nil
}

// EnterSite is SitePacer.EnterSite.
func (p *Paces) EnterSite(_ context.Context, site, holder string, limit int) (bool, error) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.site(site, now)
	n := 0
	for h, until := range ps.holders {
		if !now.Before(until) {
			delete(ps.holders, h)
			continue
		}
		n++
	}
	if _, in := ps.holders[holder]; in {
		return true, nil
	}
	if limit > 0 && n >= limit {
		return false, nil
	}
	ps.holders[holder] = now.Add(PaceHold)
	return true, nil
}

// LeaveSite is SitePacer.LeaveSite.
func (p *Paces) LeaveSite(_ context.Context, site, holder string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.sites[site]; ps != nil {
		delete(ps.holders, holder)
	}
	return nil
}

// SiteAnswered is SitePacer.SiteAnswered: rotation.LearntPace's Ban and
// Answered, with a ban through a member the site banned since its last
// cut (or to a request paced under an older cut) no news.
func (p *Paces) SiteAnswered(_ context.Context, a SiteAnswer) (rotation.LearntPace, error) {
	if _, err := rotation.ParseResult(string(a.Result)); err != nil {
		return rotation.LearntPace{}, err
	}
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.sites[a.Site]
	if !a.Result.IsBan() {
		if ps == nil {
			return rotation.LearntPace{}, nil
		}
		if ps.learntNow(now).Slowed() {
			if ps.learnt = ps.learnt.Answered(); !ps.learnt.Slowed() {
				ps.struck = nil
			}
		}
		return ps.learnt, nil
	}
	if ps == nil {
		ps = p.site(a.Site, now)
	}
	was := ps.learntNow(now)
	ps.learnt = was.BanWith(a.Result, BanSent(was, a.SeenCuts, now), now, ps.struck[a.Member], a.FirstCut)
	if ps.learnt.Cuts != was.Cuts || ps.struck == nil {
		ps.struck = map[string]bool{}
	}
	ps.struck[a.Member] = true
	return ps.learnt, nil
}

// SlowedSites is SitePacer.SlowedSites.
func (p *Paces) SlowedSites(context.Context) ([]string, error) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for site, ps := range p.sites {
		if ps.learntNow(now).Slowed() {
			out = append(out, site)
		}
	}
	return out, nil
}

// The memory Store keeps the pace of the sites beside its leases (Paces on
// the store's clock), so a lease API served from it paces for its callers.

// ReserveSlot is Paces.ReserveSlot on the store's pace.
func (s *Store) ReserveSlot(ctx context.Context, req SlotRequest) (Slot, error) {
	return s.pace.ReserveSlot(ctx, req)
}

// ReturnSlot is Paces.ReturnSlot on the store's pace.
func (s *Store) ReturnSlot(ctx context.Context, site, member string, token int64) error {
	return s.pace.ReturnSlot(ctx, site, member, token)
}

// EnterSite is Paces.EnterSite on the store's pace.
func (s *Store) EnterSite(ctx context.Context, site, holder string, limit int) (bool, error) {
	return s.pace.EnterSite(ctx, site, holder, limit)
}

// LeaveSite is Paces.LeaveSite on the store's pace.
func (s *Store) LeaveSite(ctx context.Context, site, holder string) error {
	return s.pace.LeaveSite(ctx, site, holder)
}

// SiteAnswered is Paces.SiteAnswered on the store's pace.
func (s *Store) SiteAnswered(ctx context.Context, a SiteAnswer) (rotation.LearntPace, error) {
	return s.pace.SiteAnswered(ctx, a)
}

// SlowedSites is Paces.SlowedSites on the store's pace.
func (s *Store) SlowedSites(ctx context.Context) ([]string, error) { return s.pace.SlowedSites(ctx) }
