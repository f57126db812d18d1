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

// LearntPace is one site's automatic slow-down: the interval per member
// AIMD has reached. It is a value; the gateway keeps one per site and
// replaces it with what Ban, Answered and Decayed return. The zero value is a
// site never slowed.
type LearntPace struct {
	// Interval is the learnt least time between two requests through one
	// member; 0 is none.
	Interval time.Duration
	// CutInterval is Interval right after the last cut: the additive
	// increase adds its rate back in PaceIncreaseSteps steps.
	CutInterval time.Duration
	// Cause is the answer that made the last cut (ResultRateLimited or
	// ResultBanned), CutAt when it came, Cuts how many cuts there were
	// since the site was last unlimited.
	Cause Result
	CutAt time.Time
	Cuts  int
}

// Slowed reports whether the site is paced now.
func (p LearntPace) Slowed() bool { return p.Interval > 0 }

// Ban is the pace after the site answered res (a ban signal) to a request
// sent at sent, now; known says the member it went through was banned by
// the site since the last cut already. Multiplicative decrease: the first
// ban sets PaceFirstCut, a later one doubles the interval, up to
// PaceMaxInterval. A ban that is no news changes nothing: one to a request
// sent before the last cut (it was in flight when the site was slowed), or
// through a member the site had banned since (its ban is older than the
// pace). So one burst's bans cut once, not once per request.
func (p LearntPace) Ban(res Result, sent, now time.Time, known bool) LearntPace {
	if !res.IsBan() {
		return p
	}
	if p.Slowed() && (sent.Before(p.CutAt) || known) {
		return p
	}
	next := PaceFirstCut
	if p.Slowed() {
		next = min(2*p.Interval, PaceMaxInterval)
	}
	return LearntPace{Interval: next, CutInterval: next, Cause: res, CutAt: now, Cuts: p.Cuts + 1}
}

// Answered is the pace after a request to the site was answered without
// a ban signal. Additive increase: the rate (1/Interval) grows by
// 1/(CutInterval*PaceIncreaseSteps); below PaceUnlimitedInterval the site
// is unlimited again.
func (p LearntPace) Answered() LearntPace {
	if !p.Slowed() {
		return p
	}
	cut := p.CutInterval
	if cut <= 0 {
		cut = p.Interval
	}
	// 1/next = 1/Interval + 1/(cut*steps), in float seconds.
	rate := 1/p.Interval.Seconds() + 1/(cut.Seconds()*PaceIncreaseSteps)
	next := time.Duration(float64(time.Second) / rate)
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
	return "one request per " + p.Interval.Round(time.Millisecond).String() + " per member (cut " + strconv.Itoa(p.Cuts) + "x, last by " + string(p.Cause) + ")"
}
