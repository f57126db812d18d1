package gateway

import (
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestEvidenceLogCountsAMembersRunUntilAGapOfTheWindow(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		served []time.Duration // member a's served requests
		banAt  time.Duration
		want   rotation.BanEvidence
	}{
		{"a burst: every request served, the span to the ban", []time.Duration{0, 10 * ms, 20 * ms, 30 * ms}, 50 * ms, rotation.BanEvidence{Served: 4, Span: 50 * ms}},
		{"a gap of the window starts a new run", []time.Duration{0, 10 * ms, 2010 * ms, 2020 * ms}, 2030 * ms, rotation.BanEvidence{Served: 2, Span: 20 * ms}},
		{"a ban a window after the last answer has no evidence", []time.Duration{0}, 2 * time.Second, rotation.BanEvidence{}},
		{"nothing served: no evidence", nil, time.Second, rotation.BanEvidence{}},
	} {
		l := newEvidenceLog(2 * time.Second)
		for _, at := range tc.served {
			l.served("s.example", "a", t0.Add(at))
			l.served("s.example", "b", t0.Add(at)) // another member's answers are its own
		}
		l.served("s.example", "b", t0.Add(tc.banAt))
		if got := l.evidence("s.example", "a", t0.Add(tc.banAt)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if newEvidenceLog(0) != nil {
		t.Error("a rule without a window logs")
	}
}
