package pacing

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

// TestTrailKeepsEveryMemberButTheLeaderBehindWhatTheSiteServed pins the
// trail as a sequence of (member, action) steps on an injected clock.
func TestTrailKeepsEveryMemberButTheLeaderBehindWhatTheSiteServed(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	type step struct {
		at     time.Duration
		member string
		op     string // "send" (trail), "served", "refused"
		ok     bool   // for send: whether it may go
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the first member leads; the others wait for its answers", []step{
			{0, "a", "send", true},
			{0, "b", "send", false},
			{0, "a", "send", false}, // the leader's slow start: one in flight before its first answer
			{10 * ms, "a", "served", false},
			{10 * ms, "b", "send", true},
			{10 * ms, "b", "send", false}, // b sent 1, a served 1
			{10 * ms, "a", "send", true},
			{20 * ms, "a", "served", false},
			{20 * ms, "a", "send", true}, // served 2: two in flight
			{20 * ms, "a", "send", true},
			{20 * ms, "a", "send", false},
			{20 * ms, "c", "send", true},
			{20 * ms, "c", "send", true},
			{20 * ms, "c", "send", false},
		}},
		{"an attempt that failed without an answer is in flight no more", []step{
			{0, "a", "send", true},
			{0, "a", "send", false},
			{10 * ms, "a", "unserved", false},
			{10 * ms, "a", "send", true},
		}},
		{"a refused answer counts for the leader's in flight, not as served", []step{
			{0, "a", "send", true},
			{10 * ms, "a", "refused", false},
			{10 * ms, "a", "send", true},
			{10 * ms, "b", "send", false},
		}},
		{"a leader idle for trailTakeover hands the lead over", []step{
			{0, "a", "send", true},
			{10 * ms, "b", "send", false},
			{trailTakeover, "b", "send", true},
			{trailTakeover, "a", "send", false}, // a trails b now: b served nothing yet
		}},
		{"a window without a request starts the run over", []step{
			{0, "a", "send", true},
			{10 * ms, "a", "served", false},
			{2 * time.Second, "b", "send", true}, // the new run's leader
			{2 * time.Second, "a", "send", false},
		}},
	} {
		l := newEvidenceLog(2 * time.Second)
		for i, s := range tc.steps {
			now := t0.Add(s.at)
			switch s.op {
			case "send":
				if seq, _ := l.trail("s.example", s.member, now); (seq > 0) != s.ok {
					t.Errorf("%s: step %d (%s sends at +%v): ok %v, want %v", tc.name, i, s.member, s.at, seq > 0, s.ok)
				}
			case "served":
				l.served("s.example", s.member, now)
			case "refused", "unserved":
				l.unserved("s.example", s.member, now)
			}
		}
	}
}

func TestABanIsJudgedAfterTheAnswersToItsMembersEarlierSends(t *testing.T) {
	for _, tc := range []struct {
		name       string
		thirdAfter time.Duration // when the leader's third send is served after the fourth's refusal; 0: never
		want       int
	}{
		{"the third send served a moment after the fourth was refused: counted", 20 * time.Millisecond, 3},
		{"the third never answered: the ban waits out the bound and reads what was served", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newEvidenceLog(10 * time.Second)
			now := time.Now()
			seqs := []int{}
			send := func() {
				seq, _ := l.trail("s.example", "a", now)
				if seq == 0 {
					t.Fatalf("the leader could not send (seqs %v)", seqs)
				}
				seqs = append(seqs, seq)
			}
			// The leader's slow start: one, then two in flight.
			send()
			l.served("s.example", "a", now)
			send()
			l.served("s.example", "a", now)
			send()
			send() // the fourth: refused, while the third is in flight
			if tc.thirdAfter > 0 {
				go func() {
					time.Sleep(tc.thirdAfter)
					l.served("s.example", "a", time.Now())
				}()
			}
			l.settle("s.example", "a", seqs[3], 300*time.Millisecond)
			if got := l.evidence("s.example", "a", time.Now()); got.Served != tc.want {
				t.Fatalf("judged by %+v, want %d served", got, tc.want)
			}
		})
	}
}

func TestBanEvidenceCountsWhatTheOtherMembersSent(t *testing.T) {
	l := newEvidenceLog(10 * time.Second)
	now := time.Now()
	l.trail("s.example", "a", now) // the leader
	l.served("s.example", "a", now)
	l.trail("s.example", "a", now)
	l.served("s.example", "a", now)
	for _, m := range []string{"b", "b", "c"} {
		if seq, _ := l.trail("s.example", m, now); seq == 0 {
			t.Fatalf("%s could not trail a leader served twice", m)
		}
	}
	if got := l.evidence("s.example", "a", now); got.Served != 2 || got.Others != 2 {
		t.Fatalf("%+v, want the leader's 2 served and the others' most sent, 2 (b)", got)
	}
}
