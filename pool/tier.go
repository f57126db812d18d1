package pool

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// maxTierSites bounds the sites a SiteTiers keeps; past it, those that
// matter least (on the cheapest tier, then the oldest move) are forgotten
// down to half of it. A forgotten site starts on the cheapest tier again.
const maxTierSites = 10_000

// TierLife is how long a site's place on the tiers is kept after its last
// change: a day past the longest hold, so a site that climbed is not
// forgotten while it holds, and one not seen for two days starts cheap.
const TierLife = 2 * rotation.MaxTierHold

// SiteTierKeeper keeps each site's place on the tiers (rotation.SiteTier)
// where the leases are kept, so that every gateway on one lease store
// starts a site's requests on the tier one of them learnt. Every method is
// one atomic decision on the store, on the store's clock. *Store (through
// SiteTiers) and the Redis store implement it.
type SiteTierKeeper interface {
	// StartTier is where a request to site, allowed the tiers rg, starts
	// under rule (rotation.SiteTier.Start). A probe of the tier below is
	// claimed for the caller when one is due: no other caller is given one
	// until rule.ProbeEvery has passed.
	StartTier(ctx context.Context, site string, rg rotation.TierRange, rule rotation.TierRule) (TierStart, error)
	// TierAnswered feeds one answer of site into its place (a ban signal:
	// rotation.SiteTier.Ban; ResultOK: Served; any other result changes
	// nothing) and returns the place after it.
	TierAnswered(ctx context.Context, a TierAnswer) (rotation.SiteTier, error)
}

// TierStart is StartTier's answer.
type TierStart struct {
	// Level is the tier the request starts on; Probe says it is a probe of
	// the tier below the site's.
	Level int
	Probe bool
	// Moves is the site's rotation.SiteTier.Moves the request started
	// under: its TierAnswer carries it back.
	Moves int
}

// TierAnswer is one answer of a site, for TierAnswered.
type TierAnswer struct {
	// Site is the target (rotation.TargetKey).
	Site string
	// Level is the tier that carried the request, SeenMoves its
	// TierStart.Moves.
	Level, SeenMoves int
	// Result is the answer's classification.
	Result rotation.Result
	// Rule and Top are the answering gateway's rule and costliest tier.
	Rule rotation.TierRule
	Top  int
}

// Check says what is wrong with a, naming the field.
func (a TierAnswer) Check() error {
	if _, err := rotation.ParseResult(string(a.Result)); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidResult, err)
	}
	if err := a.Rule.Check(); err != nil {
		return fmt.Errorf("tier rule: %w", err)
	}
	if a.Level < 0 || a.Level > a.Top {
		return fmt.Errorf("tier %d is not one of 0 to %d", a.Level, a.Top)
	}
	return nil
}

// Apply is the place p after a: the one reading of an answer every
// SiteTierKeeper shares (the Redis store computes it here too, then
// writes it if the site did not change meanwhile).
func (a TierAnswer) Apply(p rotation.SiteTier, now time.Time) rotation.SiteTier {
	sent := p.MovedSent(a.SeenMoves, now)
	switch {
	case a.Result.IsBan():
		return p.Ban(a.Level, sent, now, a.Rule, a.Top)
	case a.Result == rotation.ResultOK:
		return p.Served(a.Level, sent, now, a.Rule)
	}
	return p
}

// StartOf is StartTier's decision on p at now: the start, and the place
// after it (with the probe's time when one is claimed).
func StartOf(p rotation.SiteTier, now time.Time, rg rotation.TierRange, rule rotation.TierRule) (TierStart, rotation.SiteTier) {
	p = p.Settled(now, rule)
	level, probe := p.Start(now, rule, rg)
	if probe {
		p = p.Probed(now)
	}
	return TierStart{Level: level, Probe: probe, Moves: p.Moves}, p
}

// SiteTiers is the in-process SiteTierKeeper: the places of the sites one
// process sees, behind one mutex. The memory Store keeps one.
type SiteTiers struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	sites map[string]tierSite
}

type tierSite struct {
	p       rotation.SiteTier
	touched time.Time
}

// NewSiteTiers makes an empty SiteTiers on c (nil: the real clock).
func NewSiteTiers(c clock.PassiveClock) *SiteTiers {
	if c == nil {
		c = clock.RealClock{}
	}
	return &SiteTiers{clock: c, sites: map[string]tierSite{}}
}

// place is site's place now (t.mu held): the zero place for a site never
// seen or not changed for TierLife.
func (t *SiteTiers) place(site string, now time.Time) rotation.SiteTier {
	ts, ok := t.sites[site]
	if !ok {
		return rotation.SiteTier{}
	}
	if now.Sub(ts.touched) >= TierLife {
		delete(t.sites, site)
		return rotation.SiteTier{}
	}
	return ts.p
}

// keep stores site's place p (t.mu held), unless it is the zero place.
func (t *SiteTiers) keep(site string, p rotation.SiteTier, now time.Time) {
	if p == (rotation.SiteTier{}) {
		delete(t.sites, site)
		return
	}
	if _, ok := t.sites[site]; !ok && len(t.sites) >= maxTierSites {
		t.forgetLeast()
	}
	t.sites[site] = tierSite{p: p, touched: now}
}

// forgetLeast forgets sites down to half of maxTierSites: those on the
// cheapest tier first, then the longest untouched.
func (t *SiteTiers) forgetLeast() {
	type cand struct {
		site string
		ts   tierSite
	}
	all := make([]cand, 0, len(t.sites))
	for k, ts := range t.sites {
		all = append(all, cand{k, ts})
	}
	slices.SortFunc(all, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.ts.p.Level, b.ts.p.Level), a.ts.touched.Compare(b.ts.touched))
	})
	for _, c := range all[:len(all)-maxTierSites/2] {
		delete(t.sites, c.site)
	}
}

// StartTier is SiteTierKeeper.StartTier.
func (t *SiteTiers) StartTier(_ context.Context, site string, rg rotation.TierRange, rule rotation.TierRule) (TierStart, error) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.place(site, now)
	st, next := StartOf(p, now, rg, rule)
	if next != p {
		t.keep(site, next, now)
	}
	return st, nil
}

// TierAnswered is SiteTierKeeper.TierAnswered.
func (t *SiteTiers) TierAnswered(_ context.Context, a TierAnswer) (rotation.SiteTier, error) {
	if err := a.Check(); err != nil {
		return rotation.SiteTier{}, err
	}
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.place(a.Site, now)
	next := a.Apply(p, now)
	if next != p {
		t.keep(a.Site, next, now)
	}
	return next, nil
}

// StartTier is SiteTiers.StartTier on the store's tiers.
func (s *Store) StartTier(ctx context.Context, site string, rg rotation.TierRange, rule rotation.TierRule) (TierStart, error) {
	return s.tiers.StartTier(ctx, site, rg, rule)
}

// TierAnswered is SiteTiers.TierAnswered on the store's tiers.
func (s *Store) TierAnswered(ctx context.Context, a TierAnswer) (rotation.SiteTier, error) {
	return s.tiers.TierAnswered(ctx, a)
}
