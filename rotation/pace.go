package rotation

import (
	"errors"
	"math"
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

// PaceRule is what the automatic slow-down learns from a site's first
// ban, for the whole pool (--pacing-window, --pacing-increase-steps,
// --pacing-memory). A burst at a site never seen takes every member about
// as close to the site's limit as the one it banned: the site served that
// member Served requests before refusing the next, and the others have
// sent about as many within the site's window. Only the end of that window
// cools them, and no answer says how long it is. So the first ban pauses
// the whole site for Window and a tenth, then lets each member make what
// the banned one was served per that pause: a site whose window is Window
// or shorter bans no member that was within its limit at the cut. Answers
// without a ban raise the pace additively (IncreaseSteps answers add the
// restart's rate once more), never back to the rate that was refused.
type PaceRule struct {
	// Window is the longest window of a site's limit the pool is kept
	// from crossing after the first ban: how long a cut pauses the site,
	// and the span the banned member's allowance is spread over.
	Window time.Duration
	// IncreaseSteps is how many answered requests add a cut's rate once
	// more (additive increase).
	IncreaseSteps int
	// Memory is how slowly a learnt pace fades once the site has gone
	// PaceQuiet without a ban: its interval halves every Memory, so a site
	// that banned yesterday is approached at a fraction of yesterday's
	// pace, not at full speed. 0 forgets it at PaceQuiet.
	Memory time.Duration
}

// The defaults and bounds of PaceRule (docs/architecture.md argues them).
const (
	// DefaultPaceWindow covers the windows of a few seconds that most
	// per-source limits use and keeps the pause under --pacing-max-wait's
	// default, so the requests of a burst wait through it rather than
	// fail 503 paced.
	DefaultPaceWindow = 10 * time.Second
	// DefaultPaceIncreaseSteps doubles the restart's rate after 50
	// answers, as the fixed first cut did.
	DefaultPaceIncreaseSteps = PaceIncreaseSteps
	// DefaultPaceMemory halves a learnt interval every 4h of quiet: a day
	// later a site is still approached at 1/64 of its pace at the ban.
	DefaultPaceMemory = 4 * time.Hour
	// MaxPaceWindow bounds Window (a longer pause stops a crawl; a limit
	// per hour is met by an explicit pace).
	MaxPaceWindow = 10 * time.Minute
	// MaxPaceIncreaseSteps bounds IncreaseSteps (a rise this slow is none).
	MaxPaceIncreaseSteps = 1_000_000
	// MaxPaceMemory bounds Memory to a week.
	MaxPaceMemory = 7 * 24 * time.Hour
	// paceFloorMargin keeps the rise a tenth below the rate refused.
	paceFloorMargin = 10
)

// DefaultPaceRule is the rule with its defaults.
var DefaultPaceRule = PaceRule{Window: DefaultPaceWindow, IncreaseSteps: DefaultPaceIncreaseSteps, Memory: DefaultPaceMemory}

// Check says what is wrong with r, naming the field; nil when nothing is.
func (r PaceRule) Check() error {
	switch {
	case r.Window < 0 || r.Window > MaxPaceWindow:
		return errors.New("window " + r.Window.String() + " is out of range (0 to " + MaxPaceWindow.String() + "; 0: no pause, the fixed first cut)")
	case r.IncreaseSteps < 1 || r.IncreaseSteps > MaxPaceIncreaseSteps:
		return errors.New("increase steps " + strconv.Itoa(r.IncreaseSteps) + " is out of range (1 to " + strconv.Itoa(MaxPaceIncreaseSteps) + ")")
	case r.Memory < 0 || r.Memory > MaxPaceMemory:
		return errors.New("memory " + r.Memory.String() + " is out of range (0 to " + MaxPaceMemory.String() + "; 0: forget a site after " + PaceQuiet.String() + " without a ban)")
	}
	return nil
}

// BanEvidence is what the gateway saw of the banned member at a site
// before its ban, within the rule's Window: the requests the site served
// it (one still in flight then is not counted, which errs on the slow
// side), and the span from the first of them to the ban; and of the other
// members: the most requests any of them sent the site in the same run.
type BanEvidence struct {
	Served int
	Span   time.Duration
	// Others is the most requests any member but the banned one sent the
	// site in the run (answered or still in flight), when OthersKnown.
	Others int
	// OthersKnown says Others counts every request sent to the site
	// through the pool's members: the gateway that judged the ban is the
	// only one pacing on its store. Otherwise another gateway may have
	// sent through the same members, and each is taken to be at Served.
	OthersKnown bool
}

// Cut is what a site's first ban sets (PaceRule.FirstCut); the zero value
// is the fixed first cut (PaceFirstCut, no pause, PaceIncreaseSteps, no
// memory).
type Cut struct {
	// Interval is the restart's interval per member.
	Interval time.Duration
	// Pause stops every request to the site after this and every later cut.
	Pause time.Duration
	// Floor is the shortest interval the rise reaches.
	Floor time.Duration
	// Steps is PaceRule.IncreaseSteps, Memory PaceRule.Memory.
	Steps  int
	Memory time.Duration
}

// FirstCut is what a site's first ban sets under r, from what the banned
// member did. Every member may make Served requests per Window and a
// tenth (the tenth: the burst's requests went out a little before the ban
// came back), after a pause in which the burst's requests leave the
// site's window: the whole of that span when the other members may have
// sent up to Served each (the full pause), and the share of it their
// requests used when the evidence knows them (OthersKnown: a pause of
// span*Others/Served; none when they sent nothing, as when they trailed a
// leader refused before they were let go). A member that sent k then
// makes at most ceil(Served/1.1-k) more within the window of its burst:
// k and those are at most Served. The rise stops at the restart: the rate refused is Served+1
// within some span between the burst's and Window, and the restart is
// below its slowest reading.
// Without evidence (fewer than two served within the window: an address
// the site bans at sight, or answers still in flight) it is PaceFirstCut
// and no pause.
func (r PaceRule) FirstCut(ev BanEvidence) Cut {
	// The pause is a tenth longer than the window: the burst's last
	// requests went out a little before the ban came back, and stay in
	// the site's window until a window after they were sent.
	c := Cut{Interval: PaceFirstCut, Steps: r.IncreaseSteps, Memory: r.Memory}
	if ev.Served >= 2 {
		// A member refused before the site served it twice crossed no
		// rate the gateway saw: an address the site bans at sight (or
		// answers still in flight). The fixed cut, no pause: the retry
		// through another member goes at once, as a ban's always did.
		c.Pause = r.Window + r.Window/paceFloorMargin
	}
	if c.Steps <= 0 {
		c.Steps = PaceIncreaseSteps
	}
	if ev.Served >= 1 && ev.Span > 0 {
		iv := ev.Span / time.Duration(ev.Served)
		c.Floor = min(iv+iv/paceFloorMargin, PaceMaxInterval)
	}
	if r.Window > 0 && ev.Served >= 2 {
		// Served per pause: in any window of the site's as long as Window,
		// at most Served/1.1+1 requests, which is no more than Served
		// below 11 and less above; a shorter window of the site's sees
		// fewer.
		c.Interval = c.Pause / time.Duration(ev.Served)
		if ev.OthersKnown {
			// The pause only has to outlast what the others sent: a
			// member at k of Served restarting after span*k/Served makes
			// at most Served-k more before its burst leaves the window.
			// (Measured: the trailing members had sent nothing at the
			// first ban of a 3-per-3s site, and the full pause was 5.5s of
			// a 52s crawl.)
			c.Pause = c.Pause * time.Duration(min(max(ev.Others, 0), ev.Served)) / time.Duration(ev.Served)
		}
	}
	c.Interval = min(max(c.Interval, c.Floor, PaceUnlimitedInterval), PaceMaxInterval)
	if r.Window > 0 && ev.Served >= 2 {
		// The rate refused is Served+1 within some span between the
		// burst's and Window: the rise stays below its slowest reading,
		// which is the restart. (Measured: a rise past it banned the
		// other members of a 3-per-3s site within 60 requests.)
		c.Floor = c.Interval
	}
	return c
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
	// Floor is the shortest interval the rise reaches; 0 is none.
	Floor time.Duration
	// Steps is the additive increase's steps (0: PaceIncreaseSteps).
	Steps int
	// Memory is the interval's half-life once the site has gone PaceQuiet
	// without a ban (0: forgotten then), Faded how many halvings are in
	// Interval already.
	Memory time.Duration
	Faded  int
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
// A later cut's pause is the longer of the last one's and first's.
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
			Pause: first.Pause, Floor: min(first.Floor, next), Steps: first.Steps, Memory: first.Memory}
	}
	next := min(2*p.Interval, PaceMaxInterval)
	floor := min(max(p.Floor, p.Interval+p.Interval/paceFloorMargin), next)
	// A later cut pauses for the longer of the last cut's pause and the
	// one first gives: a first cut's pause may have been shortened to what
	// the other members had sent (BanEvidence.OthersKnown), while a later
	// ban's cut is judged without that (the members went by the pace, not
	// the trail, and any may be near the limit), so it is the full pause.
	return LearntPace{Interval: next, CutInterval: next, Cause: res, CutAt: now, Cuts: p.Cuts + 1,
		Pause: max(p.Pause, first.Pause), Floor: floor, Steps: p.Steps, Memory: p.Memory}
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

// Decayed is the pace as of now. A site quiet for PaceQuiet since its last
// cut fades: without Memory it is unlimited again; with it, its interval
// (and floor) halve for every Memory past PaceQuiet, and it is unlimited
// once the interval is below PaceUnlimitedInterval. The halvings already
// applied are counted (Faded), so a faded pace stored and decayed again
// at the same time is the same.
func (p LearntPace) Decayed(now time.Time) LearntPace {
	if !p.Slowed() {
		return p
	}
	quiet := now.Sub(p.CutAt) - PaceQuiet
	if quiet < 0 {
		return p
	}
	if p.Memory <= 0 {
		return LearntPace{}
	}
	n := int(min(quiet/p.Memory, 62)) + 1 // the first halving comes at PaceQuiet
	if n <= p.Faded {
		return p
	}
	f := math.Exp2(float64(n - p.Faded))
	p.Interval = time.Duration(float64(p.Interval) / f)
	p.Floor = time.Duration(float64(p.Floor) / f)
	p.Faded = n
	if p.Interval < PaceUnlimitedInterval {
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
	if p.Faded > 0 {
		s += ", faded " + strconv.Itoa(p.Faded) + "x since"
	}
	return s + ")"
}
