// Package tiering is the gateway's tier stage: which tier of egress a
// request to a site starts on (the cheapest that still works for the site,
// learnt from its bans: rotation.SiteTier), and what each answer teaches
// about it. The place of each site is kept by the lease store
// (pool.SiteTierKeeper) when it keeps one, so every gateway on it starts a
// site where one of them learnt to; else by this gateway alone.
//
// A member's tier is its attribute "tier" (AttributeTier); a request is
// narrowed to a tier by adding that attribute to its selector, so a
// client's own selector tier=NAME pins it, as any attribute does.
package tiering

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// AttributeTier is the member attribute that names its tier.
const AttributeTier = "tier"

// answerWait bounds how long an answer's report to the store may take; it
// runs after the answer went to the client.
const answerWait = 5 * time.Second

// Options configure the stage (gateway.Options.Tiers).
type Options struct {
	// Tiers is the order of the tiers, cheapest first (--tiers); fewer than
	// two turn the stage off: no request is narrowed, nothing is asked of
	// the store.
	Tiers rotation.Tiers
	// Rule is how a site climbs and comes back down (--tier-*).
	Rule rotation.TierRule
	// Clients are the tiers each token client may use (its line's tiers=,
	// read by Range); a client not named may use every tier.
	Clients map[string]rotation.TierRange
}

// Range is the tiers names say, a run of o.Tiers in their order (a token
// client's tiers=): nil is every tier; a name o.Tiers does not have, or a
// run with a gap, is an error naming them.
func (o Options) Range(names []string) (rotation.TierRange, error) {
	if names == nil {
		return o.Tiers.AllTiers(), nil
	}
	if !o.On() {
		return rotation.TierRange{}, fmt.Errorf("tiers=%s: the gateway has no --tiers", strings.Join(names, ","))
	}
	lo, hi := -1, -1
	for _, n := range names {
		l, ok := o.Tiers.Index(n)
		if !ok {
			return rotation.TierRange{}, fmt.Errorf("tiers=%s: %q is not one of --tiers %s", strings.Join(names, ","), n, strings.Join(o.Tiers, ","))
		}
		if lo < 0 || l < lo {
			lo = l
		}
		hi = max(hi, l)
	}
	if hi-lo+1 != len(names) {
		return rotation.TierRange{}, fmt.Errorf("tiers=%s: not a run of --tiers %s (a client's tiers are the cheapest it may use up to the costliest, none left out between)", strings.Join(names, ","), strings.Join(o.Tiers, ","))
	}
	return rotation.TierRange{Lo: lo, Hi: hi}, nil
}

// On reports whether the stage does anything.
func (o Options) On() bool { return len(o.Tiers) > 1 }

// Check says what is wrong with o, naming the flag.
func (o Options) Check() error {
	if !o.On() {
		return nil
	}
	if err := o.Rule.Check(); err != nil {
		return fmt.Errorf("tier rule: %w", err)
	}
	return nil
}

// Tiering is the stage. A nil *Tiering is off.
type Tiering struct {
	o      Options
	keeper pool.SiteTierKeeper
	hdr    [][]string // Header's values, by tier
	log    *slog.Logger
}

// New makes the stage on keeper (the pool's, when it keeps tiers; nil: a
// place of this gateway's own). It returns nil when o is off.
func New(o Options, keeper pool.SiteTierKeeper, log *slog.Logger) *Tiering {
	if !o.On() {
		return nil
	}
	if keeper == nil {
		keeper = pool.NewSiteTiers(nil)
	}
	if log == nil {
		log = slog.Default()
	}
	hdr := make([][]string, len(o.Tiers))
	for i, n := range o.Tiers {
		hdr[i] = []string{n}
	}
	return &Tiering{o: o, keeper: keeper, hdr: hdr, log: log}
}

// Tiers is the stage's tier order (nil when off).
func (t *Tiering) Tiers() rotation.Tiers {
	if t == nil {
		return nil
	}
	return t.o.Tiers
}

// Ticket is what a request carries from Start to Answered.
type Ticket struct {
	// Level is the tier the request is on now (Start's, then Up's).
	Level int
	// Hi is the costliest tier the request may go up to.
	Hi int
	// Moves is the site's moves the request started under.
	Moves int
	// Probe says the request probes the tier below the site's.
	Probe bool
	on    bool
}

// On reports whether the stage started the request (it narrowed it).
func (tk Ticket) On() bool { return tk.on }

// Start narrows a request of client to site with selector sel: sel with
// the tier it starts on, within the tiers the client may use, and its
// ticket. A selector that names a tier pins the request there (one
// outside the client's tiers is pool.NotShared's refusal, the gateway's
// 403 pool_forbidden) (one the gateway does not have is left to match nothing,
// as any attribute no member has); a request that names its member
// (proxy=) is left as it is. When the store cannot say (it is down), the
// request starts on the cheapest tier: the lease that follows meets the
// same store anyway.
func (t *Tiering) Start(ctx context.Context, site, client string, sel map[string]string, proxy string) (map[string]string, Ticket, error) {
	if t == nil || proxy != "" {
		return sel, Ticket{}, nil
	}
	rg, limited := t.o.Clients[client]
	if !limited {
		rg = t.o.Tiers.AllTiers()
	}
	if name, ok := sel[AttributeTier]; ok {
		level, known := t.o.Tiers.Index(name)
		if !known {
			return sel, Ticket{}, nil
		}
		if level < rg.Lo || level > rg.Hi {
			return nil, Ticket{}, pool.NotShared("client "+client, []string{"tier " + name},
				"its line's tiers= allows "+strings.Join(t.o.Tiers[rg.Lo:rg.Hi+1], ",")+" (--auth-token-file)")
		}
		rg = rotation.TierRange{Lo: level, Hi: level}
	}
	st, err := t.keeper.StartTier(ctx, site, rg, t.o.Rule)
	if err != nil {
		t.log.Warn("the lease store could not say a site's tier; starting on the cheapest", "site", site, "err", err)
		st = pool.TierStart{Level: rg.Lo}
	}
	out := make(map[string]string, len(sel)+1)
	maps.Copy(out, sel)
	out[AttributeTier] = t.o.Tiers[st.Level]
	return out, Ticket{Level: st.Level, Hi: rg.Hi, Moves: st.Moves, Probe: st.Probe, on: true}, nil
}

// Up moves a request whose tier has no member it may use for its site
// (every one resting for it, busy or down) one tier up, within what it may
// use: sel with the next tier, and true; false when it is on its costliest
// tier already. A probe that finds the cheaper tier unusable goes on as
// an ordinary request of the site's tier: nothing was learnt, and the
// client is not made to pay for the probe with a refusal.
func (t *Tiering) Up(tk *Ticket, sel map[string]string) (map[string]string, bool) {
	if t == nil || !tk.on || tk.Level >= tk.Hi {
		return sel, false
	}
	tk.Level++
	tk.Probe = false
	out := maps.Clone(sel)
	out[AttributeTier] = t.o.Tiers[tk.Level]
	return out, true
}

// Level is the tier of member attributes attrs: its "tier", the
// cheapest when it names none; ok false for a tier the gateway does not
// have.
func (o Options) Level(attrs map[string]string) (level int, ok bool) {
	name, named := attrs[AttributeTier]
	if !named {
		return 0, true
	}
	return o.Tiers.Index(name)
}

// Header is the X-Proxyfleet-Tier value of an answer carried by a member
// with attrs: its tier, one slice per tier shared by every answer (nil
// when the stage is off or the tier is not the gateway's).
func (t *Tiering) Header(attrs map[string]string) []string {
	if t == nil {
		return nil
	}
	if level, ok := t.o.Level(attrs); ok {
		return t.hdr[level]
	}
	return nil
}

// Answered teaches the site's place what the answer res through a member
// with attrs said, for a request that started with tk. A ban on the tier
// the site starts on counts toward its climb; a served probe steps it
// down. Other answers and requests the stage did not start say nothing.
func (t *Tiering) Answered(ctx context.Context, tk Ticket, site string, attrs map[string]string, res rotation.Result) {
	if t == nil || !tk.on || (!res.IsBan() && res != rotation.ResultOK) {
		return
	}
	level, ok := t.o.Level(attrs)
	if !ok {
		return
	}
	if res == rotation.ResultOK && !tk.Probe && level >= tk.Level {
		// Served where the site starts: nothing to learn, no store call.
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerWait)
	defer cancel()
	p, err := t.keeper.TierAnswered(ctx, pool.TierAnswer{Site: site, Level: level, SeenMoves: tk.Moves, Result: res, Rule: t.o.Rule, Top: t.o.Tiers.Top()})
	if err != nil {
		t.log.Warn("the lease store did not take a site's answer for its tier", "site", site, "err", err)
		return
	}
	climbed := res.IsBan() && p.Level == level+1 && p.Moves == tk.Moves+1 && p.Bans == 0
	steppedDown := res == rotation.ResultOK && tk.Probe && p.Level == level
	if climbed || steppedDown {
		t.log.Info("site moved tier", "site", site, "tier", p.String(t.o.Tiers), "after", string(res))
	}
}

// Members is members as the stage needs them in the pool: one that names
// no tier is given the cheapest (its attribute written, so that a
// request narrowed to that tier selects it), and one that names a tier the
// gateway does not have is an error naming it (it would never be chosen).
// Off, members are returned as they are.
func (o Options) Members(members []pool.Member) ([]pool.Member, error) {
	if !o.On() {
		return members, nil
	}
	out := make([]pool.Member, len(members))
	for i, m := range members {
		if _, ok := o.Level(m.Attributes); !ok {
			return nil, fmt.Errorf("member %s: tier %q is not one of --tiers %s", m.Name, m.Attributes[AttributeTier], strings.Join(o.Tiers, ","))
		}
		if _, named := m.Attributes[AttributeTier]; !named {
			attrs := make(map[string]string, len(m.Attributes)+1)
			maps.Copy(attrs, m.Attributes)
			attrs[AttributeTier] = o.Tiers[0]
			m.Attributes = attrs
		}
		out[i] = m
	}
	return out, nil
}
