package rotation

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var updateGolden = flag.Bool("update", false, "rewrite rotation/testdata/*.golden from this run")

// matchGolden compares got with testdata/name, a transcript of a sequence
// the tests pin; -update writes it from this run.
func matchGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("the sequence differs from %s (rerun with -update if intended):\n%s", path, got)
	}
}

func TestPaceLimitsStricter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		a, b, want PaceLimits
	}{
		{"nothing and nothing", PaceLimits{}, PaceLimits{}, PaceLimits{}},
		{"the longer interval", PaceLimits{MinInterval: time.Second}, PaceLimits{MinInterval: 2 * time.Second}, PaceLimits{MinInterval: 2 * time.Second}},
		{"a shorter interval never loosens", PaceLimits{MinInterval: 2 * time.Second}, PaceLimits{MinInterval: time.Second}, PaceLimits{MinInterval: 2 * time.Second}},
		{"a bound beats none", PaceLimits{}, PaceLimits{MaxConcurrency: 4}, PaceLimits{MaxConcurrency: 4}},
		{"none never loosens a bound", PaceLimits{MaxConcurrency: 4}, PaceLimits{}, PaceLimits{MaxConcurrency: 4}},
		{"the lower bound", PaceLimits{MaxConcurrency: 4}, PaceLimits{MaxConcurrency: 2}, PaceLimits{MaxConcurrency: 2}},
		{"each limit on its own", PaceLimits{MinInterval: time.Second, MaxConcurrency: 2}, PaceLimits{MinInterval: 3 * time.Second, MaxConcurrency: 8}, PaceLimits{MinInterval: 3 * time.Second, MaxConcurrency: 2}},
	} {
		if got := tc.a.Stricter(tc.b); got != tc.want {
			t.Errorf("%s: %+v.Stricter(%+v) = %+v, want %+v", tc.name, tc.a, tc.b, got, tc.want)
		}
	}
}

func TestLearntPace(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	cut := LearntPace{}.Ban(ResultRateLimited, t0, t0, false)
	sec := float64(time.Second)
	oneStep := time.Duration(sec / 1.02)
	for _, tc := range []struct {
		name string
		got  LearntPace
		want time.Duration
	}{
		{"a site never banned is never slowed", LearntPace{}.Answered(), 0},
		{"ok is no ban", LearntPace{}.Ban(ResultOK, t0, t0, false), 0},
		{"a site failure is no ban", LearntPace{}.Ban(ResultTargetUnreachable, t0, t0, false), 0},
		{"the first ban cuts to PaceFirstCut", cut, PaceFirstCut},
		{"a 403 cuts too", LearntPace{}.Ban(ResultBanned, t0, t0, false), PaceFirstCut},
		{"a ban to a request in flight at the cut changes nothing", cut.Ban(ResultBanned, t0.Add(-time.Millisecond), t0.Add(time.Millisecond), false), PaceFirstCut},
		{"a ban through a member banned since the cut changes nothing", cut.Ban(ResultBanned, t0.Add(time.Millisecond), t0.Add(2*time.Millisecond), true), PaceFirstCut},
		{"a ban to a request sent after the cut doubles", cut.Ban(ResultBanned, t0.Add(time.Millisecond), t0.Add(2*time.Millisecond), false), 2 * PaceFirstCut},
		{"the interval is capped", LearntPace{Interval: PaceMaxInterval, CutInterval: PaceMaxInterval, CutAt: t0}.Ban(ResultBanned, t0.Add(time.Second), t0.Add(time.Second), false), PaceMaxInterval},
		{"a success adds 1/50 of the cut's rate", cut.Answered(), oneStep},
		{"quiet for PaceQuiet is unlimited again", cut.Decayed(t0.Add(PaceQuiet)), 0},
		{"quiet for less is not", cut.Decayed(t0.Add(PaceQuiet - time.Second)), PaceFirstCut},
	} {
		if tc.got.Interval != tc.want {
			t.Errorf("%s: interval %v, want %v", tc.name, tc.got.Interval, tc.want)
		}
	}
	if p := cut.Ban(ResultBanned, t0.Add(time.Second), t0.Add(time.Second), false); p.Cause != ResultBanned || p.Cuts != 2 || !p.CutAt.Equal(t0.Add(time.Second)) {
		t.Errorf("second cut: %+v, want cause banned, 2 cuts, at t0+1s", p)
	}
}

// TestLearntPaceSequence pins AIMD's course through a crawl as a
// transcript (testdata/pace_aimd.golden): a burst banned in flight, the
// cut, the climb back, a second ban, the quiet decay.
func TestLearntPaceSequence(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	p := LearntPace{}
	now := t0
	step := func(what string, next LearntPace) {
		p = next
		fmt.Fprintf(&b, "t+%-8v %-44s → %s\n", now.Sub(t0), what, p)
	}
	step("200 to a burst", p.Answered())
	step("429 to a request of the burst", p.Ban(ResultRateLimited, now.Add(-50*time.Millisecond), now, false))
	for i := range 3 {
		now = now.Add(10 * time.Millisecond)
		step(fmt.Sprintf("403 to request %d in flight at the cut", i+2), p.Ban(ResultBanned, now.Add(-100*time.Millisecond), now, false))
	}
	for i := range 100 {
		now = now.Add(500 * time.Millisecond)
		next := p.Answered()
		if i%25 == 24 {
			step(fmt.Sprintf("200, the %dth since the cut", i+1), next)
		} else {
			p = next
		}
	}
	step("403 through a member banned since the cut", p.Ban(ResultBanned, now.Add(-10*time.Millisecond), now, true))
	step("429 to a request sent after the cut", p.Ban(ResultRateLimited, now.Add(-100*time.Millisecond), now, false))
	now = now.Add(PaceQuiet - time.Second)
	step("quiet for PaceQuiet less a second", p.Decayed(now))
	now = now.Add(time.Second)
	step("quiet for PaceQuiet", p.Decayed(now))
	p = LearntPace{Interval: time.Second, CutInterval: time.Second, Cause: ResultBanned, CutAt: now, Cuts: 1}
	n := 0
	for p.Slowed() {
		p = p.Answered()
		n++
	}
	fmt.Fprintf(&b, "from one cut, %d successes without a ban end the pace\n", n)

	matchGolden(t, "pace_aimd.golden", b.String())
}
