package rotation

import (
	"strings"
	"testing"
	"time"
)

func TestPaceRuleFirstCut(t *testing.T) {
	r := PaceRule{Window: 10 * time.Second, IncreaseSteps: 50, Memory: time.Hour}
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		r    PaceRule
		ev   BanEvidence
		want Cut
	}{
		{"served 5 in a burst: 5 per pause after a pause of the window and a tenth, no rise past it", r, BanEvidence{Served: 5, Span: 100 * ms},
			Cut{Interval: 2200 * ms, Pause: 11 * time.Second, Floor: 2200 * ms, Steps: 50, Memory: time.Hour}},
		{"served 101: 101 per pause", r, BanEvidence{Served: 101, Span: time.Second},
			Cut{Interval: 11 * time.Second / 101, Pause: 11 * time.Second, Floor: 11 * time.Second / 101, Steps: 50, Memory: time.Hour}},
		{"served slower than the window allows: the floor holds the restart", r, BanEvidence{Served: 3, Span: 30 * time.Second},
			Cut{Interval: 11 * time.Second, Pause: 11 * time.Second, Floor: 11 * time.Second, Steps: 50, Memory: time.Hour}},
		{"nothing served (an address banned at sight): the fixed first cut, no pause", r, BanEvidence{},
			Cut{Interval: PaceFirstCut, Steps: 50, Memory: time.Hour}},
		{"served one: no rate seen, the fixed first cut, no pause", r, BanEvidence{Served: 1, Span: 10 * ms},
			Cut{Interval: PaceFirstCut, Floor: 11 * ms, Steps: 50, Memory: time.Hour}},
		{"no window: no pause, the fixed first cut", PaceRule{IncreaseSteps: 50}, BanEvidence{Served: 5, Span: 100 * ms},
			Cut{Interval: PaceFirstCut, Floor: 22 * ms, Steps: 50}},
		{"the others known to have sent nothing: no pause, the same restart", r, BanEvidence{Served: 5, Span: 100 * ms, OthersKnown: true},
			Cut{Interval: 2200 * ms, Floor: 2200 * ms, Steps: 50, Memory: time.Hour}},
		{"the others known at 2 of 5: two fifths of the pause", r, BanEvidence{Served: 5, Span: 100 * ms, Others: 2, OthersKnown: true},
			Cut{Interval: 2200 * ms, Pause: 4400 * ms, Floor: 2200 * ms, Steps: 50, Memory: time.Hour}},
		{"the others known past what the banned one was served: the full pause", r, BanEvidence{Served: 5, Span: 100 * ms, Others: 7, OthersKnown: true},
			Cut{Interval: 2200 * ms, Pause: 11 * time.Second, Floor: 2200 * ms, Steps: 50, Memory: time.Hour}},
		{"the others not known (another gateway on the store): the full pause", r, BanEvidence{Served: 5, Span: 100 * ms, Others: 0},
			Cut{Interval: 2200 * ms, Pause: 11 * time.Second, Floor: 2200 * ms, Steps: 50, Memory: time.Hour}},
		{"an address banned at sight with the others known: still the fixed cut", r, BanEvidence{OthersKnown: true},
			Cut{Interval: PaceFirstCut, Steps: 50, Memory: time.Hour}},
		{"a restart past PaceMaxInterval is capped", PaceRule{Window: MaxPaceWindow, IncreaseSteps: 1}, BanEvidence{Served: 2, Span: 10 * ms},
			Cut{Interval: PaceMaxInterval, Pause: MaxPaceWindow + MaxPaceWindow/10, Floor: PaceMaxInterval, Steps: 1}},
	} {
		if got := tc.r.FirstCut(tc.ev); got != tc.want {
			t.Errorf("%s: FirstCut(%+v) = %+v, want %+v", tc.name, tc.ev, got, tc.want)
		}
	}
}

func TestPaceRuleCutsPausesAndRises(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	first := PaceRule{Window: 10 * time.Second, IncreaseSteps: 2, Memory: time.Hour}.FirstCut(BanEvidence{Served: 5, Span: 100 * time.Millisecond})
	cut := LearntPace{}.BanWith(ResultRateLimited, t0, t0, false, first)
	second := cut.BanWith(ResultRateLimited, t0.Add(11*time.Second), t0.Add(11*time.Second), false, first)
	unpaused := LearntPace{}.BanWith(ResultRateLimited, t0, t0, false,
		PaceRule{Window: 10 * time.Second, IncreaseSteps: 2}.FirstCut(BanEvidence{Served: 5, Span: 100 * time.Millisecond, OthersKnown: true}))
	risen := second
	for range 1000 {
		risen = risen.Answered()
	}
	for _, tc := range []struct {
		name        string
		got         LearntPace
		iv, floor   time.Duration
		pausedUntil time.Time
	}{
		{"the first ban sets the rule's cut and pauses the site", cut, 2200 * time.Millisecond, 2200 * time.Millisecond, t0.Add(11 * time.Second)},
		{"no rise past the restart", cut.Answered(), 2200 * time.Millisecond, 2200 * time.Millisecond, t0.Add(11 * time.Second)},
		{"a ban in flight at the cut changes nothing", cut.BanWith(ResultBanned, t0.Add(-time.Millisecond), t0.Add(time.Millisecond), false, first), 2200 * time.Millisecond, 2200 * time.Millisecond, t0.Add(11 * time.Second)},
		{"a later ban doubles, pauses again and floors the rise above the interval refused", second, 4400 * time.Millisecond, 2420 * time.Millisecond, t0.Add(22 * time.Second)},
		{"the rise adds the cut's rate per Steps answers", second.Answered(), 2933333333, 2420 * time.Millisecond, t0.Add(22 * time.Second)},
		{"the rise stops at the floor, never the rate refused", risen, 2420 * time.Millisecond, 2420 * time.Millisecond, t0.Add(22 * time.Second)},
		{"the fixed first cut has no pause", LearntPace{}.Ban(ResultBanned, t0, t0, false), PaceFirstCut, 0, time.Time{}},
		{"a first cut without a pause (the others sent nothing) does not pause", unpaused, 2200 * time.Millisecond, 2200 * time.Millisecond, time.Time{}},
		{"a later ban after it pauses for the full window, as its own ban's cut says", unpaused.BanWith(ResultRateLimited, t0.Add(time.Second), t0.Add(time.Second), false, first),
			4400 * time.Millisecond, 2420 * time.Millisecond, t0.Add(12 * time.Second)},
	} {
		if tc.got.Interval != tc.iv || tc.got.Floor != tc.floor || !tc.got.PausedUntil().Equal(tc.pausedUntil) {
			t.Errorf("%s: interval %v floor %v paused until %v, want %v, %v, %v", tc.name, tc.got.Interval, tc.got.Floor, tc.got.PausedUntil(), tc.iv, tc.floor, tc.pausedUntil)
		}
	}
}

func TestPaceRuleShortPauseKeepsEveryMemberWithinWhatTheBannedOneWasServed(t *testing.T) {
	// A member that sent k in the burst (at the cut, time 0) and then
	// goes by the first cut's pace (the pause, then one per Interval)
	// never has more than Served requests in any span of the site's
	// window, for any window up to the rule's: the sliding count over
	// (t-W, t] at each of its sends.
	r := PaceRule{Window: 10 * time.Second, IncreaseSteps: 50}
	for _, served := range []int{2, 3, 5, 10, 11, 50, 101} {
		for _, k := range []int{0, 1, served / 2, served - 1, served} {
			c := r.FirstCut(BanEvidence{Served: served, Span: 100 * time.Millisecond, Others: k, OthersKnown: true})
			sends := make([]time.Duration, 0, k+3*served)
			for range k {
				sends = append(sends, 0)
			}
			for j := range 3 * served {
				sends = append(sends, c.Pause+time.Duration(j)*c.Interval)
			}
			for _, w := range []time.Duration{r.Window, r.Window / 2, r.Window / 3, time.Second} {
				for i, at := range sends {
					n := 0
					for _, b := range sends[:i+1] {
						if at-b < w {
							n++
						}
					}
					if n > served {
						t.Fatalf("served %d, others at %d (pause %v, interval %v): %d sends within %v at %v", served, k, c.Pause, c.Interval, n, w, at)
					}
				}
			}
		}
	}
}

func TestLearntPaceFadesByItsMemory(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	p := LearntPace{}.BanWith(ResultBanned, t0, t0, false, Cut{Interval: 8 * time.Second, Floor: 4 * time.Second, Memory: time.Hour})
	for _, tc := range []struct {
		name      string
		at        time.Duration
		iv, floor time.Duration
	}{
		{"within the quiet period: as cut", PaceQuiet - time.Second, 8 * time.Second, 4 * time.Second},
		{"quiet for PaceQuiet: halved", PaceQuiet, 4 * time.Second, 2 * time.Second},
		{"a memory later: halved again", PaceQuiet + time.Hour, 2 * time.Second, time.Second},
		{"five hours later: 1/2^6 of the cut", PaceQuiet + 5*time.Hour, 8 * time.Second / 64, 4 * time.Second / 64},
		{"ten hours later: below PaceUnlimitedInterval, forgotten", PaceQuiet + 10*time.Hour, 0, 0},
	} {
		got := p.Decayed(t0.Add(tc.at))
		if got.Interval != tc.iv || got.Floor != tc.floor {
			t.Errorf("%s: %v, floor %v; want %v, %v", tc.name, got.Interval, got.Floor, tc.iv, tc.floor)
		}
		if again := got.Decayed(t0.Add(tc.at)); again != got {
			t.Errorf("%s: decaying a faded pace again at the same time changed it: %+v → %+v", tc.name, got, again)
		}
	}
	if got := (LearntPace{Interval: time.Second, CutAt: t0}).Decayed(t0.Add(PaceQuiet)); got.Slowed() {
		t.Errorf("a pace without memory is forgotten at PaceQuiet: %+v", got)
	}
	// A ban after the fade cuts from the faded interval, paused again.
	faded := p.Decayed(t0.Add(PaceQuiet + time.Hour))
	if again := faded.BanWith(ResultBanned, t0.Add(2*time.Hour), t0.Add(2*time.Hour), false, Cut{}); again.Interval != 4*time.Second || again.Faded != 0 {
		t.Errorf("a ban after the fade: %+v, want 4s (twice the faded 2s), fade count reset", again)
	}
}

func TestPaceRuleCheckNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		r    PaceRule
		want string
	}{
		{DefaultPaceRule, ""},
		{PaceRule{Window: -time.Second, IncreaseSteps: 1}, "window"},
		{PaceRule{Window: time.Hour, IncreaseSteps: 1}, "window"},
		{PaceRule{IncreaseSteps: 0}, "increase steps"},
		{PaceRule{IncreaseSteps: 1, Memory: -1}, "memory"},
		{PaceRule{IncreaseSteps: 1, Memory: 8 * 24 * time.Hour}, "memory"},
	} {
		err := tc.r.Check()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want an error naming %q", tc.r, err, tc.want)
		}
	}
}
