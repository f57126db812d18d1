package rotation

import (
	"testing"
	"time"
)

func TestPaceRuleFirstCut(t *testing.T) {
	r := PaceRule{Pause: time.Minute, IncreaseSteps: 50}
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		r    PaceRule
		ev   BanEvidence
		want Cut
	}{
		{"a burst refused at the 6th: 4 per pause per member", r, BanEvidence{Sent: 6, Span: 50 * ms},
			Cut{Interval: 15 * time.Second, Pause: time.Minute, Floor: 11 * ms, Steps: 50}},
		{"refused at the 2nd: one per pause", r, BanEvidence{Sent: 2, Span: 10 * ms},
			Cut{Interval: time.Minute, Pause: time.Minute, Floor: 11 * ms, Steps: 50}},
		{"no evidence: two per pause", r, BanEvidence{},
			Cut{Interval: 30 * time.Second, Pause: time.Minute, Steps: 50}},
		{"a slow crawl refused: never as fast as the refused member", r, BanEvidence{Sent: 101, Span: 100 * time.Second},
			Cut{Interval: 1100 * ms, Pause: time.Minute, Floor: 1100 * ms, Steps: 50}},
		{"a large limit: a short interval, not below the unlimited", PaceRule{Pause: 100 * ms, IncreaseSteps: 50}, BanEvidence{Sent: 1000, Span: 0},
			Cut{Interval: PaceUnlimitedInterval, Pause: 100 * ms, Steps: 50}},
		{"no pause: the fixed first cut, the floor still learnt", PaceRule{IncreaseSteps: 50}, BanEvidence{Sent: 6, Span: 5 * time.Second},
			Cut{Interval: 1100 * ms, Floor: 1100 * ms, Steps: 50}},
	} {
		if got := tc.r.FirstCut(tc.ev); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestLearntPaceWithRule: the cut carries the rule; the site is paused
// after each cut; the rise stops above the refused interval; a later cut
// doubles, pauses again and keeps the rise above what it refused.
func TestLearntPaceWithRule(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	c := Cut{Interval: 4 * time.Second, Pause: 10 * time.Second, Floor: time.Second, Steps: 2}
	p := LearntPace{}.BanWith(ResultRateLimited, t0, t0, false, c)
	if p.Interval != 4*time.Second || !p.PausedUntil().Equal(t0.Add(10*time.Second)) || p.Steps != 2 {
		t.Fatalf("first cut %+v", p)
	}
	for range 100 {
		p = p.Answered()
	}
	if p.Interval != time.Second {
		t.Fatalf("after 100 answers the interval is %v, want the floor 1s", p.Interval)
	}
	now := t0.Add(time.Minute)
	p = p.BanWith(ResultBanned, now, now, false, c)
	if p.Interval != 2*time.Second || p.Floor != 1100*time.Millisecond || !p.PausedUntil().Equal(now.Add(10*time.Second)) || p.Cuts != 2 {
		t.Fatalf("second cut %+v: want 2s, floor 1.1s, paused 10s, 2 cuts", p)
	}
	if (LearntPace{}).PausedUntil() != (time.Time{}) {
		t.Fatal("an unlimited site is paused")
	}
}

func TestSendLogEvidence(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := NewSendLog(16 * time.Second) // 1s buckets
	for i := range 5 {
		l.Sent("a.example", "m1", t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	l.Sent("a.example", "m2", t0)
	l.Sent("b.example", "m1", t0)
	if ev := l.Evidence("a.example", "m1", t0.Add(400*time.Millisecond)); ev != (BanEvidence{Sent: 5, Span: 400 * time.Millisecond}) {
		t.Errorf("burst: %+v", ev)
	}
	if ev := l.Evidence("a.example", "m2", t0.Add(time.Second)); ev.Sent != 1 {
		t.Errorf("another member: %+v", ev)
	}
	if ev := l.Evidence("a.example", "m1", t0.Add(17*time.Second)); ev != (BanEvidence{}) {
		t.Errorf("past the span: %+v, want none", ev)
	}
	if ev := l.Evidence("c.example", "m1", t0); ev != (BanEvidence{}) {
		t.Errorf("a site never sent to: %+v", ev)
	}
	// Across buckets: the older part leaves first.
	l2 := NewSendLog(16 * time.Second)
	for i := range 20 {
		l2.Sent("s", "m", t0.Add(time.Duration(i)*time.Second))
	}
	if ev := l2.Evidence("s", "m", t0.Add(19*time.Second)); ev.Sent != 16 || ev.Span != 15*time.Second {
		t.Errorf("a steady crawl: %+v, want the last 16 in 15s", ev)
	}
	var nilLog *SendLog
	nilLog.Sent("s", "m", t0)
	if ev := nilLog.Evidence("s", "m", t0); ev != (BanEvidence{}) {
		t.Errorf("nil log: %+v", ev)
	}
}

// TestSendLogTrail: one leader goes ahead; the others never send past the
// most the site has answered any member; an answer lets them on.
func TestSendLogTrail(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := NewSendLog(time.Minute)
	for i := range 3 {
		if ok, lead := l.Trail("s", "a", t0); !ok || lead != "a" {
			t.Fatalf("leader's request %d: ok %v, leader %q", i, ok, lead)
		}
	}
	if ok, lead := l.Trail("s", "b", t0); ok || lead != "a" {
		t.Fatalf("a follower before any answer: ok %v leader %q, want to go through a", ok, lead)
	}
	l.Answered("s", "a", t0)
	l.Answered("s", "a", t0)
	for i := range 2 {
		if ok, _ := l.Trail("s", "b", t0); !ok {
			t.Fatalf("follower's request %d with 2 answered: refused", i+1)
		}
	}
	if ok, _ := l.Trail("s", "b", t0); ok {
		t.Fatal("the follower's third request passed what the site has answered (2)")
	}
	if ok, _ := l.Trail("other", "b", t0); !ok {
		t.Fatal("another site: b is its leader")
	}
	l.Lead("s", "c", t0)
	if ok, lead := l.Trail("s", "c", t0); !ok || lead != "c" {
		t.Fatalf("after Lead: ok %v leader %q", ok, lead)
	}
	if ev := l.Evidence("s", "c", t0); ev.Sent != 2 {
		t.Fatalf("Lead and Trail record the request: %+v", ev)
	}
	// The counts go with the span: past it the leader explores again.
	later := t0.Add(2 * time.Minute)
	if ok, lead := l.Trail("s", "b", later); ok || lead != "c" {
		t.Fatalf("a follower past the span, before any answer: ok %v leader %q", ok, lead)
	}
	l.Answered("s", "c", later)
	if ok, _ := l.Trail("s", "b", later); !ok {
		t.Fatal("a follower past the span with one answered: held")
	}
}
