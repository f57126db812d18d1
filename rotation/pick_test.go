package rotation

import (
	"slices"
	"testing"
	"time"
)

func TestLess(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		a, b Candidate
		want bool
	}{
		{"fewer active wins over everything", Candidate{Name: "z", Active: 0, LastChosen: 9, Latency: 900 * ms}, Candidate{Name: "a", Active: 1, Latency: ms}, true},
		{"more active loses", Candidate{Name: "a", Active: 2}, Candidate{Name: "b", Active: 1}, false},
		{"never chosen beats chosen", Candidate{Name: "z", LastChosen: 0}, Candidate{Name: "a", LastChosen: 1}, true},
		{"least recently chosen wins over latency", Candidate{Name: "z", LastChosen: 3, Latency: 900 * ms}, Candidate{Name: "a", LastChosen: 4, Latency: ms}, true},
		{"lower latency wins", Candidate{Name: "z", Latency: 5 * ms}, Candidate{Name: "a", Latency: 6 * ms}, true},
		{"known latency beats unknown", Candidate{Name: "z", Latency: 900 * ms}, Candidate{Name: "a"}, true},
		{"unknown latency loses to known", Candidate{Name: "a"}, Candidate{Name: "z", Latency: 900 * ms}, false},
		{"name breaks the last tie", Candidate{Name: "a", Latency: ms}, Candidate{Name: "b", Latency: ms}, true},
		{"equal candidates are not less", Candidate{Name: "a"}, Candidate{Name: "a"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Less(tc.a, tc.b); got != tc.want {
				t.Errorf("Less(%+v, %+v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

func TestLessLeastRecentlyChosenSpreadsOverEveryMember(t *testing.T) {
	// Per-request rotation with no lease held between requests: every
	// candidate has Active 0, and the least-recently-chosen tie-break must
	// cycle through all of them, even though latencies differ (the fastest
	// member must not take every request).
	ms := time.Millisecond
	cands := []Candidate{
		{Name: "slow", Latency: 90 * ms},
		{Name: "fast", Latency: 1 * ms},
		{Name: "unknown"},
		{Name: "mid", Latency: 20 * ms},
	}
	var seq uint64
	var order []string
	counts := map[string]int{}
	for range 4 * len(cands) {
		i := 0
		for j := range cands {
			if Less(cands[j], cands[i]) {
				i = j
			}
		}
		seq++
		cands[i].LastChosen = seq
		order = append(order, cands[i].Name)
		counts[cands[i].Name]++
	}
	// First round among never-chosen members goes by latency, unknown last;
	// later rounds repeat that order.
	wantRound := []string{"fast", "mid", "slow", "unknown"}
	for r := range 4 {
		if got := order[r*4 : r*4+4]; !slices.Equal(got, wantRound) {
			t.Errorf("round %d = %v, want %v", r, got, wantRound)
		}
	}
	for _, c := range cands {
		if counts[c.Name] != 4 {
			t.Errorf("%s chosen %d times, want 4 (counts %v)", c.Name, counts[c.Name], counts)
		}
	}
}
