package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestStoreReportMemberActsLikeALeaseReport checks that a report naming a
// member, not a lease, has a lease report's effects: a ban rests the pair
// with the same backoff, an upstream failure rests the member for every
// target, and an unknown member is an error.
func TestStoreReportMemberActsLikeALeaseReport(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}}, "a", "b")
	ctx := context.Background()
	if err := s.ReportMember("a", "site", Report{Result: rotation.ResultBanned}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if l := mustAcquire(t, s, AcquireRequest{Target: "site"}); l.Member.Name != "b" {
			t.Fatalf("a lease for site went to %s while a rests for it", l.Member.Name)
		}
	}
	if until := s.Members()[0].Cooldowns["site"]; until != clk.Now().Add(time.Minute) {
		t.Fatalf("a rests for site until %v, want one default window", until)
	}
	// A second ban after the window ended doubles it, as a lease report would.
	clk.Step(time.Minute)
	if err := s.ReportMember("a", "site", Report{Result: rotation.ResultBanned}); err != nil {
		t.Fatal(err)
	}
	if until := s.Members()[0].Cooldowns["site"]; until != clk.Now().Add(2*time.Minute) {
		t.Fatalf("a rests for site until %v after a second ban, want two windows", until)
	}
	if err := s.ReportMember("b", "", Report{Result: rotation.ResultUpstreamFailed}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, AcquireRequest{Target: "other"}); err != nil {
		t.Fatalf("a lease for another site: %v, want a (b failed, a is banned only for site)", err)
	}
	if err := s.ReportMember("gone", "site", Report{Result: rotation.ResultBanned}); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("a report for an unknown member: %v, want ErrUnknownMember", err)
	}
	if err := s.ReportMember("a", "site", Report{Result: "nonsense"}); !errors.Is(err, ErrInvalidResult) {
		t.Fatalf("a report with a bad result: %v, want ErrInvalidResult", err)
	}
}

// TestStoreMergeCooldownsKeepsTheLongerWindow checks the merge rule: a
// longer window extends the store's, a shorter or ended one changes nothing,
// an every-target window takes the member out, and unknown members are
// ignored.
func TestStoreMergeCooldownsKeepsTheLongerWindow(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}}, "a", "b")
	now := clk.Now()
	mustReport(t, s, mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site"}).ID, Report{Result: rotation.ResultRateLimited})
	s.MergeCooldowns([]Cooldown{
		{Member: "a", Target: "site", Until: now.Add(30 * time.Second)},                   // shorter: ignored
		{Member: "a", Target: "other", Until: now.Add(5 * time.Minute), Reason: "banned"}, // new
		{Member: "a", Target: "past", Until: now.Add(-time.Second)},                       // ended: ignored
		{Member: "gone", Target: "site", Until: now.Add(time.Hour)},                       // unknown: ignored
		{Member: "b", Target: "", Until: now.Add(20 * time.Second)},                       // every target
	})
	got := map[string]time.Time{}
	for _, c := range mustList(t, s) {
		got[c.Member+"/"+c.Target] = c.Until
	}
	want := map[string]time.Time{
		"a/site":  now.Add(time.Minute),
		"a/other": now.Add(5 * time.Minute),
		"b/":      now.Add(20 * time.Second),
	}
	if len(got) != len(want) {
		t.Fatalf("cooldowns %v, want %v", got, want)
	}
	for k, w := range want {
		if !got[k].Equal(w) {
			t.Fatalf("cooldown %s ends %v, want %v (all: %v)", k, got[k], w, got)
		}
	}
	s.MergeCooldowns([]Cooldown{{Member: "a", Target: "site", Until: now.Add(10 * time.Minute)}})
	if until := s.Members()[0].Cooldowns["site"]; !until.Equal(now.Add(10 * time.Minute)) {
		t.Fatalf("a longer merged window: a rests for site until %v, want 10m", until)
	}
	// b rests for every target until its merged window ends, then returns.
	if _, err := s.Acquire(context.Background(), AcquireRequest{Proxy: "b", Target: "x"}); err == nil {
		t.Fatal("b was leased inside its merged every-target window")
	}
	clk.Step(20 * time.Second)
	mustAcquire(t, s, AcquireRequest{Proxy: "b", Target: "x"})
}

func mustList(t *testing.T, s *Store) []Cooldown {
	t.Helper()
	cs, err := s.ListCooldowns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
