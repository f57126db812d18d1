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
		{"a burst refused after 5 served: 4 per pause per member, no rise past it, the steps per member", r, BanEvidence{Served: 5, Sent: 9, Span: 50 * ms, Members: 3},
			Cut{Interval: 15 * time.Second, Pause: time.Minute, Floor: 15 * time.Second, Steps: 150}},
		{"refused after 2 served: one per pause", r, BanEvidence{Served: 2, Sent: 3, Span: 10 * ms, Members: 1},
			Cut{Interval: time.Minute, Pause: time.Minute, Floor: time.Minute, Steps: 50}},
		{"refused after 1 served, nothing in flight: an address ban, the fixed cut", r, BanEvidence{Served: 1, Sent: 2, Span: 10 * ms, Members: 1},
			Cut{Interval: PaceFirstCut, Floor: 11 * ms, Steps: 50}},
		{"its first request refused: no rate crossed, the fixed cut, no pause", r, BanEvidence{Sent: 1, Members: 2},
			Cut{Interval: PaceFirstCut, Steps: 100}},
		{"several sent, none answered yet: one per pause", r, BanEvidence{Sent: 8, Span: 5 * ms, Members: 1},
			Cut{Interval: time.Minute, Pause: time.Minute, Floor: time.Minute, Steps: 50}},
		{"a slow crawl refused: never as fast as the refused member", r, BanEvidence{Served: 100, Sent: 101, Span: 100 * time.Second, Members: 1},
			Cut{Interval: 1100 * ms, Pause: time.Minute, Floor: 1100 * ms, Steps: 50}},
		{"a slow crawl at a long window: no rise past the restart", r, BanEvidence{Served: 20, Sent: 21, Span: 10 * time.Second, Members: 1},
			Cut{Interval: 60 * time.Second / 19, Pause: time.Minute, Floor: 60 * time.Second / 19, Steps: 50}},
		{"a large limit: a short interval, not below the unlimited", PaceRule{Pause: 100 * ms, IncreaseSteps: 50}, BanEvidence{Served: 1000, Sent: 1001, Members: 2},
			Cut{Interval: PaceUnlimitedInterval, Pause: 100 * ms, Floor: 100 * ms / 999, Steps: 100}},
		{"no pause: the fixed first cut, the floor still learnt", PaceRule{IncreaseSteps: 50}, BanEvidence{Served: 5, Sent: 6, Span: 5 * time.Second, Members: 1},
			Cut{Interval: 1100 * ms, Floor: 1100 * ms, Steps: 50}},
		{"the steps are bounded", PaceRule{Pause: time.Minute, IncreaseSteps: MaxPaceIncreaseSteps}, BanEvidence{Served: 5, Sent: 6, Span: time.Second, Members: 3},
			Cut{Interval: 15 * time.Second, Pause: time.Minute, Floor: 15 * time.Second, Steps: MaxPaceIncreaseSteps}},
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
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		l.Sent("a.example", "m1", at)
		if i < 3 {
			l.Answered("a.example", "m1", at)
		}
	}
	l.Sent("a.example", "m2", t0)
	l.Sent("b.example", "m1", t0)
	// 5 sent, 3 answered (the rest in flight or refused): the site served 3.
	if ev := l.Evidence("a.example", "m1", t0.Add(400*time.Millisecond)); ev != (BanEvidence{Served: 3, Sent: 5, Span: 400 * time.Millisecond, Members: 2}) {
		t.Errorf("burst: %+v", ev)
	}
	if ev := l.Evidence("a.example", "m2", t0.Add(time.Second)); ev.Served != 0 || ev.Members != 2 {
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
		at := t0.Add(time.Duration(i) * time.Second)
		l2.Sent("s", "m", at)
		l2.Answered("s", "m", at)
	}
	if ev := l2.Evidence("s", "m", t0.Add(19*time.Second)); ev.Served != 16 || ev.Span != 15*time.Second {
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
	if ev := l.Evidence("s", "c", t0); ev.Sent != 2 || ev.Members != 3 {
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
