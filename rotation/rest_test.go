package rotation

import (
	"sort"
	"testing"
	"time"
)

func TestFailureRestAdmit(t *testing.T) {
	tests := []struct {
		name      string
		percent   int
		resting   int
		members   int
		wantEvict bool
	}{
		{"the first failure of a pool rests without evicting", 0, 0, 4, false},
		{"a lone member may rest (the override keeps it serving)", 0, 0, 1, false},
		{"below half of four: a second member rests too", 0, 1, 4, false},
		{"half of four rest: a third failure evicts the least recently failed", 0, 2, 4, true},
		{"two of three rest already: evict", 0, 2, 3, true},
		{"one of three rests: a second may join (Envoy's rule, 66%)", 0, 1, 3, false},
		{"one of two rests: the other's failure evicts it", 0, 1, 2, true},
		{"100 percent lets every member rest", 100, 3, 4, false},
		{"above 100 is 100", 250, 3, 4, false},
		{"10 percent of twenty is two", 10, 2, 20, true},
		{"10 percent of twenty: the second may rest", 10, 1, 20, false},
		{"a tiny share still rests one member", 1, 0, 20, false},
		{"no members: nothing to evict", 0, 3, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (FailureRest{MaxPercent: tt.percent}).Admit(tt.resting, tt.members); got != tt.wantEvict {
				t.Fatalf("Admit(%d, %d) at %d%% evicts %v, want %v", tt.resting, tt.members, tt.percent, got, tt.wantEvict)
			}
		})
	}
}

// TestFailureRestKeepsShare replays failures of distinct members one after
// another through Admit and checks the share never passes the maximum.
func TestFailureRestKeepsShare(t *testing.T) {
	for _, pct := range []int{1, 10, 25, 50, 75, 99, 100} {
		for n := 1; n <= 40; n++ {
			p := FailureRest{MaxPercent: pct}
			resting := 0
			for i := 0; i < 2*n; i++ {
				if !p.Admit(resting, n) {
					resting++
				}
				limit := max(1, (pct*n+99)/100)
				if resting > limit || resting > n {
					t.Fatalf("%d%% of %d: %d resting, limit %d", pct, n, resting, limit)
				}
			}
			if resting == 0 {
				t.Fatalf("%d%% of %d: nothing rests", pct, n)
			}
		}
	}
}

func TestOverrideLessPrefersLeastRecentlyFailed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	got := []Rested{
		{Candidate: Candidate{Name: "recent", LastChosen: 1}, Until: t0.Add(3 * time.Second)},
		{Candidate: Candidate{Name: "b-tie", LastChosen: 9}, Until: t0.Add(time.Second)},
		{Candidate: Candidate{Name: "a-tie-chosen-earlier", LastChosen: 2}, Until: t0.Add(time.Second)},
		{Candidate: Candidate{Name: "oldest", LastChosen: 50, Active: 3}, Until: t0},
	}
	sort.Slice(got, func(i, j int) bool { return OverrideLess(got[i], got[j]) })
	want := []string{"oldest", "a-tie-chosen-earlier", "b-tie", "recent"}
	for i, r := range got {
		if r.Name != want[i] {
			t.Fatalf("order %v, want %v", names(got), want)
		}
	}
}

func names(rs []Rested) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

func TestParseResultAcceptsAnswered(t *testing.T) {
	if r, err := ParseResult("answered"); err != nil || r != ResultAnswered {
		t.Fatalf("ParseResult(answered) = %q, %v", r, err)
	}
}
