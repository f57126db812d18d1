package rotation

import (
	"strconv"
	"time"
)

// PaceLimits is an explicit pace for a site: what an operator (or one
// crawler, for itself) allows. The zero value allows anything.
type PaceLimits struct {
	// MinInterval is the least time between two requests to the site
	// through one member (one source address, as the site sees it); 0 is
	// no interval.
	MinInterval time.Duration
	// MaxConcurrency bounds the requests to the site in flight across the
	// whole pool; 0 is no bound.
	MaxConcurrency int
}

// IsZero reports whether l limits nothing.
func (l PaceLimits) IsZero() bool { return l.MinInterval <= 0 && l.MaxConcurrency <= 0 }

// Stricter is the stricter of l and o in each limit: the longer interval,
// the lower non-zero concurrency. A crawler's own pace meets the
// operator's this way, so it can never loosen it.
func (l PaceLimits) Stricter(o PaceLimits) PaceLimits {
	if o.MinInterval > l.MinInterval {
		l.MinInterval = o.MinInterval
	}
	if o.MaxConcurrency > 0 && (l.MaxConcurrency <= 0 || o.MaxConcurrency < l.MaxConcurrency) {
		l.MaxConcurrency = o.MaxConcurrency
	}
	return l
}

// The automatic slow-down's constants (AIMD per site, LearntPace). They
// are deliberately few and fixed; an operator who knows a site's limit
// sets it explicitly instead.
const (
	// PaceFirstCut is the per-member interval a site gets at its first ban:
	// the gateway cannot know the site's rule, and one request per second
	// per source is below what nearly every site that rate-limits allows
	// (and a waterfall runs at tens per second).
	PaceFirstCut = time.Second
	// PaceMaxInterval caps the learnt interval: a site that still bans at
	// one request per minute per member is cooling members down anyway.
	PaceMaxInterval = time.Minute
	// PaceIncreaseSteps is how many answered requests it takes to add the
	// rate of the last cut once more (additive increase): from one request
	// per second, 50 successes make it two.
	PaceIncreaseSteps = 50
	// PaceUnlimitedInterval is where the learnt pace ends: an interval this
	// short is no pace worth keeping.
	PaceUnlimitedInterval = 10 * time.Millisecond
	// PaceQuiet is how long a site must go without a ban for its learnt
	// pace to be forgotten (decay back to unlimited).
	PaceQuiet = 10 * time.Minute
)

// PaceRule is the automatic slow-down's rule for what a site's first ban
// teaches the whole pool (--pacing-pause, --pacing-increase-steps). A burst
// at a site never seen leaves every member about as close to the site's
// limit as the one it banned: only the site's window ending cools them,
// and no answer says how long that is. So a cut pauses the whole site for
// Pause (the longest window the rule protects the pool against), then
// restarts each member at the pace the banned one was allowed: its
// requests before the refusal, spread over Pause. Answers without a ban
// raise it additively, never back to the rate that was refused.
type PaceRule struct {
	// Pause is how long a cut stops every request to the site, and the
	// span the banned member's allowance is spread over at the restart.
	Pause time.Duration
	// IncreaseSteps is how many answered requests per member add a cut's
	// rate once more (additive increase).
	IncreaseSteps int
}

// Bounds and defaults of PaceRule (docs/architecture.md argues them).
const (
	// DefaultPacePause covers the per-minute windows that are the longest
	// common ones: after a burst no member that was within the limit
	// crosses it at a site whose window is a minute or less.
	DefaultPacePause = time.Minute
	// DefaultPaceIncreaseSteps doubles a cut's rate after 50 answers of
	// each member, as the fixed first cut did (per answer, pool-wide).
	DefaultPaceIncreaseSteps = PaceIncreaseSteps
	// MaxPacePause bounds Pause to half of PaceQuiet, which would forget
	// the cut during a longer one.
	MaxPacePause = PaceQuiet / 2
	// MaxPaceIncreaseSteps bounds IncreaseSteps (a rise this slow is none).
	MaxPaceIncreaseSteps = 1_000_000
	// paceFloorMargin keeps the learnt interval a tenth above the
	// interval that was refused.
	paceFloorMargin = 10
)

// DefaultPaceRule is the rule with its defaults.
var DefaultPaceRule = PaceRule{Pause: DefaultPacePause, IncreaseSteps: DefaultPaceIncreaseSteps}

// BanEvidence is what the gateway saw at a site before a member's ban:
// the requests of the banned member the site answered without a ban
// within the rule's Pause (what it allows; one still in flight then is
// not counted, which errs on the slow side), the span from that member's
// first request in it to the ban, and the members that sent to the site
// in it.
type BanEvidence struct {
	Served  int
	Span    time.Duration
	Members int
	// Sent is the banned member's requests to the site within the pause,
	// the refused one included.
	Sent int
}

// Cut is what a site's first cut sets (PaceRule.FirstCut); the zero value
// is the fixed first cut (PaceFirstCut, no pause, PaceIncreaseSteps).
type Cut struct {
	// Interval is the restart's interval per member.
	Interval time.Duration
	// Pause stops the site after this and every later cut.
	Pause time.Duration
	// Floor is the shortest interval the additive increase reaches: a
	// tenth above the interval at which the banned member was refused.
	Floor time.Duration
	// Steps is PaceRule.IncreaseSteps.
	Steps int
}

// FirstCut is the cut a site's first ban makes under r, from what the
// banned member did. The site served it Served requests before refusing
// the next, so every member may make at most Served-1 (a margin of one
// for a site counting the refused request, or a boundary of a fixed
// window) in any Pause: the interval Pause/(Served-1), which is also the
// floor (the most a window as long as the pause allows, with a request's
// jitter), and never the rate the banned member went at. A member
// refused after at most one answer, nothing else in flight, crossed no
// rate: the fixed cut, no pause. The
// rise's steps are per member: IncreaseSteps answers of each member that
// sent to the site add the restart's rate once more.
func (r PaceRule) FirstCut(ev BanEvidence) Cut {
	c := Cut{Pause: r.Pause, Steps: min(r.IncreaseSteps*max(ev.Members, 1), MaxPaceIncreaseSteps), Interval: PaceFirstCut}
	if ev.Served >= 1 {
		c.Floor = refusedFloor(ev)
	}
	if ev.Served < 2 && ev.Sent <= ev.Served+1 {
		// The site refused the member after at most one answer, with
		// nothing else of it in flight: that is an address the site bans
		// (or a limit used up before the span), not a rate crossed, and
		// a limit of one per window is no burst to learn from. The fixed
		// cut, no pause: the request's retry through another member goes
		// at once, as a ban's retry always did.
		c.Pause = 0
		return c
	}
	if r.Pause <= 0 {
		// No pause: the fixed first cut, the rate still derived.
		c.Interval = max(c.Interval, c.Floor)
		return c
	}
	// Served 0 of several sent: the answers are still in flight; one per
	// Pause until a second cut says more.
	allowed := max(ev.Served-1, 1)
	// No rise past the restart: a request one slot late and the next on
	// time put W/interval+1 in a window, so Served-1 per Pause is the
	// most a site whose window is as long as the pause allows.
	c.Floor = min(max(c.Floor, r.Pause/time.Duration(allowed)), PaceMaxInterval)
	c.Interval = min(max(r.Pause/time.Duration(allowed), c.Floor, PaceUnlimitedInterval), PaceMaxInterval)
	return c
}

// refusedFloor is a tenth above the banned member's mean interval (its
// served requests and the refused one over the span).
func refusedFloor(ev BanEvidence) time.Duration {
	iv := ev.Span / time.Duration(ev.Served)
	return min(iv+iv/paceFloorMargin, PaceMaxInterval)
}

// LearntPace is one site's automatic slow-down: the interval per member
// AIMD has reached. It is a value; the gateway keeps one per site and
// replaces it with what Ban, Answered and Decayed return. The zero value is a
// site never slowed.
type LearntPace struct {
	// Interval is the learnt least time between two requests through one
	// member; 0 is none.
	Interval time.Duration
	// CutInterval is Interval right after the last cut: the additive
	// increase adds its rate back in Steps steps.
	CutInterval time.Duration
	// Cause is the answer that made the last cut (ResultRateLimited or
	// ResultBanned), CutAt when it came, Cuts how many cuts there were
	// since the site was last unlimited.
	Cause Result
	CutAt time.Time
	Cuts  int
	// Pause stops every request to the site for this long after each cut
	// (no member's slot comes before CutAt+Pause); 0 is none.
	Pause time.Duration
	// Floor is the shortest interval the increase reaches: above the
	// rate a ban refused. 0 is none.
	Floor time.Duration
	// Steps is the additive increase's steps (0: PaceIncreaseSteps).
	Steps int
}

// Slowed reports whether the site is paced now.
func (p LearntPace) Slowed() bool { return p.Interval > 0 }

// PausedUntil is when the pause of the last cut ends (zero: no pause).
func (p LearntPace) PausedUntil() time.Time {
	if !p.Slowed() || p.Pause <= 0 {
		return time.Time{}
	}
	return p.CutAt.Add(p.Pause)
}

// Ban is BanWith the fixed first cut (Cut{}).
func (p LearntPace) Ban(res Result, sent, now time.Time, known bool) LearntPace {
	return p.BanWith(res, sent, now, known, Cut{})
}

// BanWith is the pace after the site answered res (a ban signal) to a
// request sent at sent, now; known says the member it went through was
// banned by the site since the last cut already. Multiplicative decrease:
// the first ban sets first (PaceRule.FirstCut; the zero Cut is
// PaceFirstCut), a later one doubles the interval, up to PaceMaxInterval,
// pauses the site again and puts the floor above the interval it refused.
// A ban that is no news changes nothing: one to a request sent before the
// last cut (it was in flight when the site was slowed), or through a
// member the site had banned since (its ban is older than the pace). So
// one burst's bans cut once, not once per request.
func (p LearntPace) BanWith(res Result, sent, now time.Time, known bool, first Cut) LearntPace {
	if !res.IsBan() {
		return p
	}
	if p.Slowed() && (sent.Before(p.CutAt) || known) {
		return p
	}
	if !p.Slowed() {
		next := first.Interval
		if next <= 0 {
			next = PaceFirstCut
		}
		next = min(next, PaceMaxInterval)
		return LearntPace{Interval: next, CutInterval: next, Cause: res, CutAt: now, Cuts: p.Cuts + 1,
			Pause: first.Pause, Floor: min(first.Floor, next), Steps: first.Steps}
	}
	next := min(2*p.Interval, PaceMaxInterval)
	floor := min(max(p.Floor, p.Interval+p.Interval/paceFloorMargin), next)
	return LearntPace{Interval: next, CutInterval: next, Cause: res, CutAt: now, Cuts: p.Cuts + 1,
		Pause: p.Pause, Floor: floor, Steps: p.Steps}
}

// Answered is the pace after a request to the site was answered without
// a ban signal. Additive increase: the rate (1/Interval) grows by
// 1/(CutInterval*Steps), never past 1/Floor; below PaceUnlimitedInterval
// the site is unlimited again.
func (p LearntPace) Answered() LearntPace {
	if !p.Slowed() {
		return p
	}
	cut := p.CutInterval
	if cut <= 0 {
		cut = p.Interval
	}
	steps := p.Steps
	if steps <= 0 {
		steps = PaceIncreaseSteps
	}
	// 1/next = 1/Interval + 1/(cut*steps), in float seconds.
	rate := 1/p.Interval.Seconds() + 1/(cut.Seconds()*float64(steps))
	next := max(time.Duration(float64(time.Second)/rate), p.Floor)
	if next < PaceUnlimitedInterval {
		return LearntPace{}
	}
	p.Interval = next
	return p
}

// Decayed is the pace as of now: a site quiet for PaceQuiet since its
// last cut is unlimited again.
func (p LearntPace) Decayed(now time.Time) LearntPace {
	if p.Slowed() && now.Sub(p.CutAt) >= PaceQuiet {
		return LearntPace{}
	}
	return p
}

// String is the pace in words, for status pages and refusals.
func (p LearntPace) String() string {
	if !p.Slowed() {
		return "unlimited"
	}
	s := "one request per " + p.Interval.Round(time.Millisecond).String() + " per member (cut " + strconv.Itoa(p.Cuts) + "x, last by " + string(p.Cause)
	if p.Pause > 0 {
		s += ", the site paused " + p.Pause.String() + " at each cut"
	}
	return s + ")"
}
