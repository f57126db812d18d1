package quota

import (
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func TestTakeIsGCRA(t *testing.T) {
	iv := 100 * time.Millisecond
	tests := []struct {
		name     string
		tat, now time.Time
		burst    int64
		wantTat  time.Time
		ok       bool
		wait     time.Duration
	}{
		{"a rate never used fits", time.Time{}, t0, 1, t0.Add(iv), true, 0},
		{"a tat in the past counts from now", t0.Add(-time.Hour), t0, 1, t0.Add(iv), true, 0},
		{"burst 1: the next request waits one interval", t0.Add(iv), t0, 1, t0.Add(iv), false, iv},
		{"burst 3: two ahead fit", t0.Add(2 * iv), t0, 3, t0.Add(3 * iv), true, 0},
		{"burst 3: three ahead wait one interval", t0.Add(3 * iv), t0, 3, t0.Add(3 * iv), false, iv},
		{"half an interval later the wait is half", t0.Add(iv), t0.Add(iv / 2), 1, t0.Add(iv), false, iv / 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tat, ok, wait := Take(tc.tat, tc.now, iv, tc.burst)
			if !tat.Equal(tc.wantTat) || ok != tc.ok || wait != tc.wait {
				t.Fatalf("Take = %v %v %v, want %v %v %v", tat.Sub(t0), ok, wait, tc.wantTat.Sub(t0), tc.ok, tc.wait)
			}
		})
	}
}

func TestTakeRatesTakesBothOrNeither(t *testing.T) {
	l := Limits{RPS: 10, SiteRPS: 1} // overall burst 10, site burst 1
	tat, st, ref := TakeRates(l, time.Time{}, time.Time{}, t0)
	if ref != nil || !tat.Equal(t0.Add(100*time.Millisecond)) || !st.Equal(t0.Add(time.Second)) {
		t.Fatalf("first request: %v %v %v", tat.Sub(t0), st.Sub(t0), ref)
	}
	tat2, st2, ref := TakeRates(l, tat, st, t0)
	if ref == nil || ref.Which != WhichSiteRPS || ref.RetryAfter != time.Second || !tat2.Equal(tat) || !st2.Equal(st) {
		t.Fatalf("second to the site: %v %v %+v, want a site-rps refusal taking nothing", tat2.Sub(t0), st2.Sub(t0), ref)
	}
	// Overall refuses with the longer wait when both do.
	full := t0.Add(time.Second)
	_, _, ref = TakeRates(Limits{RPS: 10, SiteRPS: 100}, full, t0.Add(time.Second), t0)
	if ref == nil || ref.Which != WhichRPS {
		t.Fatalf("overall budget spent: %+v, want rps", ref)
	}
	if _, _, ref := TakeRates(Limits{}, full, full, t0); ref != nil {
		t.Fatalf("no limits refused: %+v", ref)
	}
}

func TestTakeLease(t *testing.T) {
	if TakeLease(Limits{Leases: 2}, 1) != nil || TakeLease(Limits{}, 1000) != nil {
		t.Fatal("refused below the quota or without one")
	}
	if r := TakeLease(Limits{Leases: 2}, 2); r == nil || r.Which != WhichLeases || r.RetryAfterSeconds() != 1 {
		t.Fatalf("at the quota: %+v", r)
	}
}

func TestCheckNamesTheBadLimit(t *testing.T) {
	tests := []struct {
		l    Limits
		want string
	}{
		{Limits{Leases: -1}, "leases=-1 is negative"},
		{Limits{RPS: -0.5}, "rps=-0.5"},
		{Limits{SiteRPS: math.NaN()}, "site-rps=NaN"},
		{Limits{RPS: 2e6}, "rps=2e+06"},
	}
	for _, tc := range tests {
		if err := tc.l.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%+v) = %v, want %q", tc.l, err, tc.want)
		}
	}
	if err := (Limits{Leases: 3, RPS: 0.1, SiteRPS: MaxRPS}).Check(); err != nil {
		t.Fatal(err)
	}
}

func TestRetryAfterSecondsRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, 90 * time.Second: 90} {
		if got := (&Refusal{RetryAfter: d}).RetryAfterSeconds(); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestTakeBytesRefusesUntilTheUTCDayEnds(t *testing.T) {
	l := Limits{BytesPerDay: 100}
	if TakeBytes(l, 99, t0) != nil || TakeBytes(Limits{}, 1<<40, t0) != nil {
		t.Fatal("refused below the quota or without one")
	}
	r := TakeBytes(l, 100, t0) // t0 is noon UTC
	if r == nil || r.Which != WhichBytes || r.RetryAfter != 12*time.Hour {
		t.Fatalf("at the quota at noon: %+v, want bytes-per-day for 12h", r)
	}
	if Day(t0.Add(12*time.Hour)) != Day(t0)+1 || Day(t0.Add(12*time.Hour-time.Nanosecond)) != Day(t0) {
		t.Fatal("Day does not turn at UTC midnight")
	}
}
