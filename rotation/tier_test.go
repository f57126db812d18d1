package rotation

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseTiers(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Tiers
		err      string
	}{
		{"nothing is the one default tier", "", Tiers{DefaultTier}, ""},
		{"the order is kept, cheapest first", "own,datacenter,residential,mobile", Tiers{"own", "datacenter", "residential", "mobile"}, ""},
		{"spaces around names are dropped", " own , residential ", Tiers{"own", "residential"}, ""},
		{"a gap in the order is refused", "own,,residential", nil, `tier 2 of "own,,residential" is empty (a gap in the order)`},
		{"a trailing comma is a gap", "own,", nil, "tier 2 of"},
		{"a name twice is refused", "own,residential,own", nil, `tier "own" is named twice`},
		{"upper case is refused", "Own", nil, `tier "Own": a name is lower-case letters`},
		{"a name starting with a digit is refused", "4g", nil, `tier "4g"`},
		{"an underscore is refused", "res_idential", nil, `tier "res_idential"`},
		{"seventeen tiers are refused", strings.Repeat("a,", 16) + "b", nil, "17 tiers; at most 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTiers(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseTiers(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("ParseTiers(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestTierRuleCheckNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*TierRule)
		err  string
	}{
		{"the defaults are good", func(*TierRule) {}, ""},
		{"no bans escalate", func(r *TierRule) { r.Threshold = 0 }, "escalate bans 0 is out of range"},
		{"a negative window", func(r *TierRule) { r.Window = -time.Second }, "escalate window -1s is out of range"},
		{"no hold", func(r *TierRule) { r.Hold = 0 }, "hold 0s is out of range"},
		{"a hold past a day", func(r *TierRule) { r.Hold = 25 * time.Hour }, "hold 25h0m0s is out of range"},
		{"probes rarer than the hold", func(r *TierRule) { r.ProbeEvery = time.Hour }, "probe every 1h0m0s is out of range (above 0, at most the hold, 30m0s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := DefaultTierRule
			tc.edit(&r)
			err := r.Check()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Check() = %v, want %q", err, tc.err)
			}
		})
	}
}

// TestSiteTierBansThatEscalate pins which bans count toward a climb.
func TestSiteTierBansThatEscalate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	r := DefaultTierRule
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type ban struct {
		level int
		sent  time.Duration // before now
		now   time.Duration
	}
	for _, tc := range []struct {
		name      string
		start     SiteTier
		bans      []ban
		top       int
		wantLevel int
	}{
		{"three bans within the window climb one tier", SiteTier{}, []ban{{0, 0, 0}, {0, 0, time.Minute}, {0, 0, 2 * time.Minute}}, 2, 1},
		{"two bans do not", SiteTier{}, []ban{{0, 0, 0}, {0, 0, time.Minute}}, 2, 0},
		{"bans further apart than the window do not", SiteTier{}, []ban{{0, 0, 0}, {0, 0, 6 * time.Minute}, {0, 0, 11 * time.Minute}}, 2, 0},
		{"the costliest tier has nowhere to climb", SiteTier{}, []ban{{0, 0, 0}, {0, 0, time.Second}, {0, 0, 2 * time.Second}}, 0, 0},
		{"bans on a costlier tier than the site's say nothing of it", SiteTier{}, []ban{{1, 0, 0}, {1, 0, time.Second}, {1, 0, 2 * time.Second}}, 2, 0},
		{"bans of requests in flight at the climb are no news",
			SiteTier{Level: 1, Since: at(time.Minute)}, []ban{{1, 2 * time.Minute, time.Minute + time.Second}, {1, 2 * time.Minute, time.Minute + 2*time.Second}, {1, 2 * time.Minute, time.Minute + 3*time.Second}}, 2, 1},
		{"bans on the site's tier after it climbed count again",
			SiteTier{Level: 1, Since: at(time.Minute)}, []ban{{1, 0, 2 * time.Minute}, {1, 0, 3 * time.Minute}, {1, 0, 4 * time.Minute}}, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.start
			for _, b := range tc.bans {
				now := at(b.now)
				s = s.Ban(b.level, now.Add(-b.sent), now, r, tc.top)
			}
			if s.Level != tc.wantLevel {
				t.Fatalf("level %d after the bans (%+v), want %d", s.Level, s, tc.wantLevel)
			}
		})
	}
}

// TestSiteTierStartHonoursTheRequestsRange pins where a request starts:
// the site's tier within what its client may use, a probe only where the
// site's own tier would have carried it.
func TestSiteTierStartHonoursTheRequestsRange(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	r := DefaultTierRule
	held := SiteTier{Level: 2, Since: t0}
	afterHold := t0.Add(r.Hold)
	for _, tc := range []struct {
		name      string
		s         SiteTier
		now       time.Time
		rg        TierRange
		wantLevel int
		wantProbe bool
	}{
		{"a new site starts on the cheapest tier", SiteTier{}, t0, TierRange{0, 3}, 0, false},
		{"a client without the cheapest tier starts on its cheapest", SiteTier{}, t0, TierRange{1, 3}, 1, false},
		{"an escalated site starts on its tier within the hold", held, t0.Add(r.Hold - time.Second), TierRange{0, 3}, 2, false},
		{"after the hold one request probes the tier below", held, afterHold, TierRange{0, 3}, 1, true},
		{"no probe within ProbeEvery of the last", held.Probed(afterHold), afterHold.Add(r.ProbeEvery - time.Second), TierRange{0, 3}, 2, false},
		{"the next probe after ProbeEvery", held.Probed(afterHold), afterHold.Add(r.ProbeEvery), TierRange{0, 3}, 1, true},
		{"a client capped below the site's tier gets its cap and never probes", held, afterHold, TierRange{0, 1}, 1, false},
		{"a client pinned above the site's tier gets its pin", held, afterHold, TierRange{3, 3}, 3, false},
		{"a client whose cheapest is the site's tier does not probe below it", held, afterHold, TierRange{2, 3}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level, probe := tc.s.Start(tc.now, r, tc.rg)
			if level != tc.wantLevel || probe != tc.wantProbe {
				t.Fatalf("Start = %d, probe %v; want %d, probe %v", level, probe, tc.wantLevel, tc.wantProbe)
			}
		})
	}
}

// TestSiteTierSequence pins a site's course on three tiers as a transcript
// (testdata/tier_sequence.golden): the climb, the hold, a probe banned, a
// probe served and the step down, the climb back with the hold doubled,
// and the hold held without a ban clearing it.
func TestSiteTierSequence(t *testing.T) {
	tiers := Tiers{"own", "datacenter", "residential"}
	r := DefaultTierRule
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	s := SiteTier{}
	now := t0
	step := func(what string, next SiteTier) {
		s = next
		fmt.Fprintf(&b, "t+%-10v %-70s → %s\n", now.Sub(t0), what, s.String(tiers))
	}
	start := func() int {
		if settled := s.Settled(now, r); settled != s {
			step("the site has settled", settled)
		}
		level, probe := s.Start(now, r, tiers.AllTiers())
		what := "a request starts on " + tiers[level]
		if probe {
			what += " (a probe)"
			step(what, s.Probed(now))
		} else {
			fmt.Fprintf(&b, "t+%-10v %s\n", now.Sub(t0), what)
		}
		return level
	}
	ban := func(level int, what string, sent time.Duration) {
		step(what+" on "+tiers[level]+" is banned", s.Ban(level, now.Add(-sent), now, r, tiers.Top()))
	}
	served := func(level int, what string) {
		step(what+" on "+tiers[level]+" is served", s.Served(level, now.Add(-time.Second), now, r))
	}

	for i := range 3 {
		now = now.Add(20 * time.Second)
		ban(start(), fmt.Sprintf("request %d", i+1), time.Second)
	}
	climbed := now
	now = now.Add(time.Second)
	ban(0, "a request sent before the climb", 2*time.Second)
	now = now.Add(time.Second)
	served(start(), "the next request")
	now = climbed.Add(r.Hold - time.Second)
	start()
	now = climbed.Add(r.Hold)
	ban(start(), "the probe", time.Second)
	now = now.Add(r.ProbeEvery)
	start()
	now = now.Add(r.Hold)
	served(start(), "the probe")
	for i := range 3 {
		now = now.Add(20 * time.Second)
		ban(start(), fmt.Sprintf("after the step down, request %d", i+1), time.Second)
	}
	climbed = now
	now = climbed.Add(r.Hold)
	start()
	now = climbed.Add(2 * r.Hold)
	served(start(), "the probe")
	now = now.Add(2*r.Hold - time.Second)
	served(start(), "a request")
	now = now.Add(time.Second)
	served(start(), "a request a whole doubled hold after the step down")
	for i := range 3 {
		now = now.Add(20 * time.Second)
		ban(start(), fmt.Sprintf("settled, request %d", i+1), time.Second)
	}
	now = now.Add(r.Hold)
	start()

	matchGolden(t, "tier_sequence.golden", b.String())
}
