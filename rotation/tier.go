package rotation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tiers is the operator's order of egress tiers, cheapest first
// (--tiers own,datacenter,residential): a member's tier is an index into
// it, and a site climbs it one step at a time. One tier (the default)
// makes every site's tier 0 and the rule below a no-op.
type Tiers []string

// DefaultTier is the one tier of a gateway that names none.
const DefaultTier = "default"

// maxTiers bounds the tier order: a ladder longer than this is a typo or a
// price list, not an escalation path.
const maxTiers = 16

// ParseTiers reads a comma-separated tier order, cheapest first. Names are
// lower-case letters, digits and '-' (they are metric labels and
// username parameters), each once; "" is the one DefaultTier.
func ParseTiers(s string) (Tiers, error) {
	if strings.TrimSpace(s) == "" {
		return Tiers{DefaultTier}, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxTiers {
		return nil, fmt.Errorf("%d tiers; at most %d", len(parts), maxTiers)
	}
	out := make(Tiers, 0, len(parts))
	for i, p := range parts {
		name := strings.TrimSpace(p)
		if name == "" {
			return nil, fmt.Errorf("tier %d of %q is empty (a gap in the order)", i+1, s)
		}
		if !validTierName(name) {
			return nil, fmt.Errorf("tier %q: a name is lower-case letters, digits and '-', starting with a letter, at most 32 characters", name)
		}
		if _, dup := out.Index(name); dup {
			return nil, fmt.Errorf("tier %q is named twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}

func validTierName(s string) bool {
	if len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Index is name's place in t, cheapest 0; ok false when t has no such tier.
func (t Tiers) Index(name string) (level int, ok bool) {
	for i, n := range t {
		if n == name {
			return i, true
		}
	}
	return 0, false
}

// Top is the costliest tier's level.
func (t Tiers) Top() int { return len(t) - 1 }

// TierRule is how a site climbs the tiers and comes back down
// (--tier-escalate-bans, --tier-escalate-window, --tier-hold,
// --tier-probe-every). A site starts on the cheapest tier. Threshold bans
// of requests carried by its current tier within Window move it one tier
// up: one ban is a member's bad luck (its cooldown answers it), a few in a
// row on different members are the site refusing the whole tier. After
// Hold on a tier, one request per ProbeEvery goes a tier lower; served, the
// site steps down; banned, the hold starts again. Each climb back to a tier
// the site had stepped down from doubles the hold (up to MaxHold), so a
// site that bans the cheap tier only once it is used again costs a
// shrinking number of bans, not Threshold per Hold for ever.
type TierRule struct {
	// Threshold is how many bans on the site's tier within Window move it
	// one tier up.
	Threshold int
	// Window is the span Threshold bans must fall in.
	Window time.Duration
	// Hold is how long a site stays on a tier before probing the one below.
	Hold time.Duration
	// ProbeEvery is the least time between two probes of the cheaper tier.
	ProbeEvery time.Duration
}

// The defaults and bounds of TierRule (docs/tiers.md argues them).
const (
	// DefaultTierThreshold: three bans on three members (each ban cools
	// its member for the site, so the next request takes another) within
	// the window is a site refusing the tier, not one bad address.
	DefaultTierThreshold = 3
	// DefaultTierWindow: bans further apart than this are the ordinary
	// attrition of a cheap tier, which cooldowns already answer.
	DefaultTierWindow = 10 * time.Minute
	// DefaultTierHold: a site's ban of an address range outlasts minutes;
	// half an hour on the costlier tier before asking again keeps probes
	// to a couple an hour.
	DefaultTierHold = 30 * time.Minute
	// DefaultTierProbeEvery: one request a minute tries the cheaper tier
	// once the hold is over, so a step down comes within a minute of the
	// site forgiving, at the price of at most one banned cheap request a
	// hold.
	DefaultTierProbeEvery = time.Minute
	// MaxTierThreshold bounds Threshold (past it a site never escalates).
	MaxTierThreshold = 1000
	// MaxTierHold bounds Hold, and the doubled hold of a site that keeps
	// climbing back, to a day.
	MaxTierHold = 24 * time.Hour
)

// DefaultTierRule is the rule with its defaults.
var DefaultTierRule = TierRule{Threshold: DefaultTierThreshold, Window: DefaultTierWindow, Hold: DefaultTierHold, ProbeEvery: DefaultTierProbeEvery}

// Check says what is wrong with r, naming the field; nil when nothing is.
func (r TierRule) Check() error {
	switch {
	case r.Threshold < 1 || r.Threshold > MaxTierThreshold:
		return errors.New("escalate bans " + strconv.Itoa(r.Threshold) + " is out of range (1 to " + strconv.Itoa(MaxTierThreshold) + ")")
	case r.Window <= 0 || r.Window > MaxTierHold:
		return errors.New("escalate window " + r.Window.String() + " is out of range (above 0, at most " + MaxTierHold.String() + ")")
	case r.Hold <= 0 || r.Hold > MaxTierHold:
		return errors.New("hold " + r.Hold.String() + " is out of range (above 0, at most " + MaxTierHold.String() + ")")
	case r.ProbeEvery <= 0 || r.ProbeEvery > r.Hold:
		return errors.New("probe every " + r.ProbeEvery.String() + " is out of range (above 0, at most the hold, " + r.Hold.String() + ")")
	}
	return nil
}

// hold is how long a site stays on its tier after climbing climbs times
// since it last held a tier through a whole hold: Hold, doubled per climb
// back after the first, at most MaxTierHold.
func (r TierRule) hold(climbs int) time.Duration {
	h := r.Hold
	for i := 1; i < climbs && h < MaxTierHold; i++ {
		h *= 2
	}
	return min(h, MaxTierHold)
}

// TierRange is the tiers one request may use: its client's allowance
// narrowed by its own pin or cap, Lo to Hi inclusive.
type TierRange struct{ Lo, Hi int }

// AllTiers is every tier of t.
func (t Tiers) AllTiers() TierRange { return TierRange{0, t.Top()} }

// SiteTier is one site's place on the tiers. It is a value; the store
// keeps one per site (beside its cooldowns and pace) and replaces it with
// what Ban, Served and Probed return, so every gateway on the store starts
// the site's requests where one of them learnt to. The zero value is a
// site on the cheapest tier with nothing learnt.
type SiteTier struct {
	// Level is the tier the site's requests start on.
	Level int
	// Since is when the site reached Level, or when a cheaper tier last
	// failed it (the hold counts from there).
	Since time.Time
	// Bans are the bans on Level counted since BansFrom (within Window).
	Bans     int
	BansFrom time.Time
	// Climbs is how many times the site climbed since it last held a tier
	// through a whole hold without a ban; each climb after the first
	// doubles the hold.
	Climbs int
	// LastProbe is when a request last probed the tier below Level.
	LastProbe time.Time
	// Down says the site's last move was a step down: only a tier it
	// stepped down to settles (Settled); the tier it climbed to is where
	// it is expected to stay until probed.
	Down bool
	// Moves counts the site's changes of tier: a request remembers the
	// count it started under, and an answer to one started under fewer
	// was in flight when the site moved (MovedSent).
	Moves int
}

// MovedSent is the send time Ban and Served want for an answer to a
// request that started when the site had made seenMoves moves: before the
// last move when it started under an earlier one, now otherwise. Stores
// use it so that no gateway's clock meets the store's.
func (s SiteTier) MovedSent(seenMoves int, now time.Time) time.Time {
	if seenMoves < s.Moves {
		return s.Since.Add(-time.Nanosecond)
	}
	return now
}

// Start is where a request to the site with range rg starts (on s as
// Settled leaves it): the site's
// tier held within rg, and probe true when it is a probe of the tier below
// (the hold is over and no probe went for ProbeEvery). The caller that
// sends a probe stores Probed(now), so other requests and other gateways
// do not probe at the same time.
func (s SiteTier) Start(now time.Time, r TierRule, rg TierRange) (level int, probe bool) {
	level = min(max(s.Level, rg.Lo), rg.Hi)
	if level != s.Level || level <= rg.Lo {
		return level, false // the client chose another tier, or none is cheaper for it
	}
	if now.Sub(s.Since) < r.hold(s.Climbs) || now.Sub(s.LastProbe) < r.ProbeEvery {
		return level, false
	}
	return level - 1, true
}

// Probed is s after a probe of the tier below was sent at now.
func (s SiteTier) Probed(now time.Time) SiteTier {
	s.LastProbe = now
	return s
}

// Ban is s after a request sent at sent and carried by tier level met a
// ban signal of the site, now (top is the costliest tier). A request sent
// before the site's last change is no news (it was in flight when the site
// moved). A ban on a cheaper tier than the site's (a probe, or a client's
// pin or cap) starts the hold again; on a costlier one it says nothing
// about the site's tier. Threshold bans on the site's own tier within
// Window move the site one tier up.
func (s SiteTier) Ban(level int, sent, now time.Time, r TierRule, top int) SiteTier {
	if sent.Before(s.Since) || level > s.Level {
		return s
	}
	if level < s.Level {
		s.Since = now
		return s
	}
	if s.Bans == 0 || now.Sub(s.BansFrom) > r.Window {
		s.Bans, s.BansFrom = 0, now
	}
	s.Bans++
	if s.Bans < r.Threshold || s.Level >= top {
		return s
	}
	return SiteTier{Level: s.Level + 1, Since: now, Climbs: s.Climbs + 1, LastProbe: s.LastProbe, Moves: s.Moves + 1}
}

// Served is s after a request sent at sent and carried by tier level was
// served, now: a cheaper tier than the site's serving it (a probe, or a
// client's pin or cap) steps the site down to that tier. Its own tier
// serving it teaches nothing (Settled clears the climbs).
func (s SiteTier) Served(level int, sent, now time.Time, r TierRule) SiteTier {
	if sent.Before(s.Since) || level >= s.Level {
		return s
	}
	return SiteTier{Level: level, Since: now, Climbs: s.Climbs, LastProbe: s.LastProbe, Down: true, Moves: s.Moves + 1}
}

// Settled is s as of now: a site that has held the tier it stepped down
// to through a whole hold, with no ban on it for as long, has its climbs
// cleared, so its next climb holds for Hold again. Stores apply it
// where a request starts (StartTier), so a settled site costs no write of
// its own.
func (s SiteTier) Settled(now time.Time, r TierRule) SiteTier {
	if s.Climbs == 0 || !s.Down {
		return s
	}
	// The last ban on this tier came at most Window after BansFrom.
	h := r.hold(s.Climbs)
	if now.Sub(s.Since) >= h && (s.Bans == 0 || now.Sub(s.BansFrom) >= r.Window+h) {
		s.Climbs, s.Bans, s.BansFrom = 0, 0, time.Time{}
	}
	return s
}

// String is the site's tier in words, for status pages and answers.
func (s SiteTier) String(t Tiers) string {
	name := strconv.Itoa(s.Level)
	if s.Level >= 0 && s.Level < len(t) {
		name = t[s.Level]
	}
	if s.Since.IsZero() {
		return name
	}
	out := name + " since " + s.Since.UTC().Format(time.RFC3339)
	if s.Climbs > 1 {
		out += " (climbed " + strconv.Itoa(s.Climbs) + "x: the hold is doubled)"
	}
	return out
}
