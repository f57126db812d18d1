package pool

import (
	"context"
	"errors"
	"fmt"
	clocktesting "k8s.io/utils/clock/testing"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// newFakeClock is a manually stepped clock for the store's time decisions.
func newFakeClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
}

func proxyMember(t testing.TB, name string, attrs ...string) Member {
	t.Helper()
	u := &url.URL{Scheme: "http", Host: "127.0.0.1:3128"}
	m := Member{Name: name, URL: u, Attributes: map[string]string{}}
	for i := 0; i+1 < len(attrs); i += 2 {
		m.Attributes[attrs[i]] = attrs[i+1]
	}
	return m
}

func newTestStore(t testing.TB, o StoreOptions, names ...string) (*Store, *clocktesting.FakeClock) {
	t.Helper()
	clk := newFakeClock()
	o.Clock = clk
	s := NewStore(o)
	ms := make([]Member, 0, len(names))
	for _, n := range names {
		ms = append(ms, proxyMember(t, n))
	}
	s.SetMembers(ms)
	return s, clk
}

func mustAcquire(t testing.TB, s *Store, req AcquireRequest) Lease {
	t.Helper()
	l, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", req, err)
	}
	return l
}

func mustReport(t testing.TB, s *Store, id string, r Report) {
	t.Helper()
	if err := s.Report(context.Background(), id, r); err != nil {
		t.Fatalf("Report(%s, %+v): %v", id, r, err)
	}
}

func noMatch(t testing.TB, err error) NoMatchError {
	t.Helper()
	var nm *NoMatchError
	if !errors.As(err, &nm) {
		t.Fatalf("error = %v, want *NoMatchError", err)
	}
	return *nm
}

func TestStoreAcquireTTL(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{DefaultTTL: 30 * time.Second, MaxTTL: 5 * time.Minute}, "a")
	tests := []struct {
		name     string
		ttl      time.Duration
		wantTTL  time.Duration
		wantErr  error
		wantText string
	}{
		{"zero ttl means the default", 0, 30 * time.Second, nil, ""},
		{"ttl below the maximum is kept", time.Minute, time.Minute, nil, ""},
		{"ttl equal to the maximum is allowed", 5 * time.Minute, 5 * time.Minute, nil, ""},
		{"ttl above the maximum is refused with the numbers", 6 * time.Minute, 0, ErrTTLTooLong, "6m0s > 5m0s"},
		{"negative ttl is refused", -time.Second, 0, ErrInvalidTTL, "-1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := s.Acquire(context.Background(), AcquireRequest{TTL: tc.ttl})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("error = %v, want %v mentioning %q", err, tc.wantErr, tc.wantText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.TTL != tc.wantTTL || !l.ExpiresAt.Equal(clk.Now().Add(tc.wantTTL)) {
				t.Errorf("lease TTL %v expires %v, want TTL %v from now", l.TTL, l.ExpiresAt, tc.wantTTL)
			}
		})
	}
	if got := s.ActiveLeases(); got != 3 {
		t.Errorf("ActiveLeases = %d after 3 grants and 2 refusals, want 3", got)
	}
}

func TestStoreLeaseIDsAreRandomAndUnique(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{}, "a")
	seen := map[string]bool{}
	for range 1000 {
		l := mustAcquire(t, s, AcquireRequest{})
		if len(l.ID) < 26 {
			t.Fatalf("lease ID %q is shorter than 128 bits of base32", l.ID)
		}
		if seen[l.ID] {
			t.Fatalf("lease ID %q handed out twice", l.ID)
		}
		seen[l.ID] = true
	}
}

func TestStorePerRequestCyclesSpreadOverEveryMember(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	s, _ := newTestStore(t, StoreOptions{}, names...)
	counts := map[string]int{}
	for range 100 {
		l := mustAcquire(t, s, AcquireRequest{Target: "example.com"})
		counts[l.Member.Name]++
		if err := s.Release(context.Background(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		if counts[n] != 20 {
			t.Errorf("member %s chosen %d times in 100 acquire+release cycles, want 20 (counts %v)", n, counts[n], counts)
		}
	}
}

func TestStoreSelectionOrder(t *testing.T) {
	t.Run("fewest active leases first", func(t *testing.T) {
		s, _ := newTestStore(t, StoreOptions{}, "a", "b", "c")
		held := map[string]int{}
		for range 6 {
			held[mustAcquire(t, s, AcquireRequest{}).Member.Name]++
		}
		for _, n := range []string{"a", "b", "c"} {
			if held[n] != 2 {
				t.Errorf("%s holds %d of 6 unreleased leases, want 2 (%v)", n, held[n], held)
			}
		}
	})
	t.Run("lowest latency among never chosen, unknown last", func(t *testing.T) {
		s, _ := newTestStore(t, StoreOptions{}, "a", "b", "c")
		s.SetHealth("a", true, 0)
		s.SetHealth("b", true, 50*time.Millisecond)
		s.SetHealth("c", true, 5*time.Millisecond)
		var got []string
		for range 3 {
			l := mustAcquire(t, s, AcquireRequest{})
			got = append(got, l.Member.Name)
			_ = s.Release(context.Background(), l.ID)
		}
		if strings.Join(got, ",") != "c,b,a" {
			t.Errorf("order = %v, want c,b,a", got)
		}
	})
}

func TestStoreSelectorAndPin(t *testing.T) {
	clk := newFakeClock()
	s := NewStore(StoreOptions{Clock: clk})
	s.SetMembers([]Member{
		proxyMember(t, "eu1", "region", "eu", "tier", "dc"),
		proxyMember(t, "eu2", "region", "eu", "tier", "res"),
		proxyMember(t, "us1", "region", "us", "tier", "dc"),
	})
	tests := []struct {
		name      string
		req       AcquireRequest
		wantOneOf []string
		wantNone  bool
	}{
		{"no selector matches all", AcquireRequest{}, []string{"eu1", "eu2", "us1"}, false},
		{"single attribute", AcquireRequest{Selector: map[string]string{"region": "eu"}}, []string{"eu1", "eu2"}, false},
		{"every pair must match", AcquireRequest{Selector: map[string]string{"region": "eu", "tier": "dc"}}, []string{"eu1"}, false},
		{"missing attribute does not match an empty value", AcquireRequest{Selector: map[string]string{"zone": ""}}, nil, true},
		{"no member matches", AcquireRequest{Selector: map[string]string{"region": "ap"}}, nil, true},
		{"pin by name", AcquireRequest{Proxy: "us1"}, []string{"us1"}, false},
		{"pin and selector agree", AcquireRequest{Proxy: "eu2", Selector: map[string]string{"region": "eu"}}, []string{"eu2"}, false},
		{"pin outside the selector", AcquireRequest{Proxy: "us1", Selector: map[string]string{"region": "eu"}}, nil, true},
		{"pin to an unknown name", AcquireRequest{Proxy: "nope"}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 6 {
				l, err := s.Acquire(context.Background(), tc.req)
				if tc.wantNone {
					if nm := noMatch(t, err); nm != (NoMatchError{}) {
						t.Fatalf("NoMatchError = %+v, want all zero (nothing matched)", nm)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = s.Release(context.Background(), l.ID)
				ok := false
				for _, n := range tc.wantOneOf {
					ok = ok || l.Member.Name == n
				}
				if !ok {
					t.Fatalf("got member %s, want one of %v", l.Member.Name, tc.wantOneOf)
				}
			}
		})
	}
}

func TestStoreSelectorFollowsReloadedAttributes(t *testing.T) {
	// Selectors walk per-attribute indexes that a reload must keep in step
	// with the members' attributes and health.
	s, _ := newTestStore(t, StoreOptions{})
	eu := map[string]string{"region": "eu"}
	steps := []struct {
		name    string
		members []MemberHealth
		want    string       // the member a region=eu lease goes to
		wantNM  NoMatchError // when want is ""
	}{
		{"eu1 is in eu", []MemberHealth{
			{Member: proxyMember(t, "eu1", "region", "eu"), Healthy: true},
			{Member: proxyMember(t, "us1", "region", "us"), Healthy: true},
		}, "eu1", NoMatchError{}},
		{"the two swap regions", []MemberHealth{
			{Member: proxyMember(t, "eu1", "region", "us"), Healthy: true},
			{Member: proxyMember(t, "us1", "region", "eu"), Healthy: true},
		}, "us1", NoMatchError{}},
		{"nobody is in eu any more", []MemberHealth{
			{Member: proxyMember(t, "eu1", "region", "us"), Healthy: true},
			{Member: proxyMember(t, "us1", "region", "us"), Healthy: true},
		}, "", NoMatchError{}},
		{"the only eu member is unhealthy", []MemberHealth{
			{Member: proxyMember(t, "eu1", "region", "eu"), Healthy: false},
			{Member: proxyMember(t, "us1", "region", "us"), Healthy: true},
		}, "", NoMatchError{Considered: 1, Unhealthy: 1}},
		{"a new eu member joins", []MemberHealth{
			{Member: proxyMember(t, "eu1", "region", "eu"), Healthy: false},
			{Member: proxyMember(t, "eu2", "region", "eu"), Healthy: true},
			{Member: proxyMember(t, "us1", "region", "us"), Healthy: true},
		}, "eu2", NoMatchError{}},
	}
	for _, st := range steps {
		s.SetMembersHealth(st.members)
		l, err := s.Acquire(context.Background(), AcquireRequest{Selector: eu})
		switch {
		case st.want == "":
			if nm := noMatch(t, err); nm != st.wantNM {
				t.Errorf("%s: NoMatchError = %+v, want %+v", st.name, nm, st.wantNM)
			}
		case err != nil || l.Member.Name != st.want:
			t.Errorf("%s: leased %s, %v; want %s", st.name, l.Member.Name, err, st.want)
		default:
			_ = s.Release(context.Background(), l.ID)
		}
	}
}

func TestStoreNoMatchCountsAreAdditive(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{MaxLeasesPerMember: 1}, "cap", "cool", "sick", "sick2", "free")
	s.SetHealth("sick", false, 0)
	s.SetHealth("sick2", false, 0)
	// "cap" holds its one allowed lease.
	capLease := mustAcquire(t, s, AcquireRequest{Proxy: "cap", Target: "other.com"})
	// "cool" is cooling down for site.com.
	l := mustAcquire(t, s, AcquireRequest{Proxy: "cool", Target: "site.com"})
	mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
	_ = s.Release(context.Background(), l.ID)
	// "free" is eligible but taken by this lease, so next time it is at capacity.
	free := mustAcquire(t, s, AcquireRequest{Target: "site.com"})
	if free.Member.Name != "free" {
		t.Fatalf("eligible member = %s, want free", free.Member.Name)
	}
	_, err := s.Acquire(context.Background(), AcquireRequest{Target: "site.com"})
	nm := noMatch(t, err)
	want := NoMatchError{Considered: 5, AtCapacity: 2, InCooldown: 1, Unhealthy: 2}
	if nm != want {
		t.Errorf("NoMatchError = %+v, want %+v", nm, want)
	}
	if nm.Considered != nm.AtCapacity+nm.InCooldown+nm.Unhealthy {
		t.Errorf("counts not additive: %+v", nm)
	}
	// Releasing frees capacity again.
	_ = s.Release(context.Background(), capLease.ID)
	if l := mustAcquire(t, s, AcquireRequest{Target: "site.com"}); l.Member.Name != "cap" {
		t.Errorf("after release got %s, want cap", l.Member.Name)
	}
}

func TestStoreUnhealthyThenHealthy(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{}, "a")
	s.SetHealth("a", false, 0)
	if nm := noMatch(t, func() error { _, err := s.Acquire(context.Background(), AcquireRequest{}); return err }()); nm.Unhealthy != 1 || nm.Considered != 1 {
		t.Errorf("NoMatchError = %+v, want 1 considered, 1 unhealthy", nm)
	}
	s.SetHealth("a", true, 3*time.Millisecond)
	mustAcquire(t, s, AcquireRequest{})
	s.SetHealth("ghost", false, 0) // unknown member: ignored, no panic
	if st := s.Members(); len(st) != 1 || !st[0].Healthy || st[0].Latency != 3*time.Millisecond {
		t.Errorf("Members = %+v", st)
	}
}

func TestStoreCooldownIsPerTarget(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{Cooldown: rotation.CooldownPolicy{Default: 10 * time.Minute, Max: time.Hour}}, "a", "b")
	l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.com"})
	mustReport(t, s, l.ID, Report{Result: rotation.ResultRateLimited, RetryAfter: 2 * time.Second})
	_ = s.Release(context.Background(), l.ID)

	for range 5 {
		got := mustAcquire(t, s, AcquireRequest{Target: "site.com"})
		_ = s.Release(context.Background(), got.ID)
		if got.Member.Name != "b" {
			t.Fatalf("site.com got %s inside a's window, want b", got.Member.Name)
		}
	}
	_, err := s.Acquire(context.Background(), AcquireRequest{Proxy: "a", Target: "site.com"})
	if nm := noMatch(t, err); nm.InCooldown != 1 {
		t.Errorf("pinning a for site.com: %+v, want 1 in cooldown", nm)
	}
	// Other targets still use a.
	if got := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "other.com"}); got.Member.Name != "a" {
		t.Errorf("other.com got %s, want a", got.Member.Name)
	}
	// Retry-After was 2s: just before, still cooling; at 2s, free again.
	clk.Step(2*time.Second - time.Nanosecond)
	if _, err := s.Acquire(context.Background(), AcquireRequest{Proxy: "a", Target: "site.com"}); err == nil {
		t.Fatal("a leased for site.com before Retry-After passed")
	}
	clk.Step(time.Nanosecond)
	mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.com"})
}

func TestStoreBanBackoffAndReset(t *testing.T) {
	pol := rotation.CooldownPolicy{Default: time.Minute, Max: 5 * time.Minute}
	s, clk := newTestStore(t, StoreOptions{Cooldown: pol, MaxTTL: 24 * time.Hour}, "a")
	lease := mustAcquire(t, s, AcquireRequest{Target: "site.com", TTL: 24 * time.Hour})
	cooldownLeft := func() time.Duration {
		t.Helper()
		st := s.Members()[0]
		until, ok := st.Cooldowns["site.com"]
		if !ok {
			return 0
		}
		return until.Sub(clk.Now())
	}
	ban := func() { mustReport(t, s, lease.ID, Report{Result: rotation.ResultBanned}) }

	steps := []struct {
		name string
		do   func()
		want time.Duration
	}{
		{"first ban: default window", ban, time.Minute},
		{"second ban inside the window adds no strike", func() { clk.Step(30 * time.Second); ban() }, time.Minute},
		{"ban after the window doubles", func() { clk.Step(time.Minute); ban() }, 2 * time.Minute},
		{"next doubles again", func() { clk.Step(2 * time.Minute); ban() }, 4 * time.Minute},
		{"next is capped", func() { clk.Step(4 * time.Minute); ban() }, 5 * time.Minute},
		{"ok keeps the running window", func() { mustReport(t, s, lease.ID, Report{Result: rotation.ResultOK}) }, 5 * time.Minute},
		{"ban after ok starts from the base", func() { clk.Step(5 * time.Minute); ban() }, time.Minute},
		{"strikes are forgotten Max after the window", func() {
			clk.Step(time.Minute)
			ban() // strike 2: 2m
			clk.Step(2*time.Minute + pol.Max)
			ban()
		}, time.Minute},
	}
	for _, st := range steps {
		st.do()
		if got := cooldownLeft(); got != st.want {
			t.Fatalf("%s: cooldown left %v, want %v", st.name, got, st.want)
		}
	}
}

func TestStoreUpstreamFailureIsGlobal(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{FailureWindow: 30 * time.Second}, "a", "b")
	l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.com"})
	mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed, Target: "site.com"})
	for _, target := range []string{"site.com", "other.com", ""} {
		if got := mustAcquire(t, s, AcquireRequest{Target: target}); got.Member.Name != "b" {
			t.Errorf("target %q got %s during a's failure window, want b", target, got.Member.Name)
		}
	}
	if st := s.Members()[0]; !st.Healthy || st.Cooldowns[""].IsZero() {
		t.Errorf("a = %+v, want healthy with a global cooldown", st)
	}
	if n := s.ActiveCooldowns(); n != 1 {
		t.Errorf("ActiveCooldowns = %d, want 1", n)
	}
	clk.Step(30 * time.Second)
	mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.com"})
	if n := s.ActiveCooldowns(); n != 0 {
		t.Errorf("ActiveCooldowns after the window = %d, want 0", n)
	}
}

func TestStoreTargetUnreachableRestsOnlyThePairBrieflyAndKeepsStrikes(t *testing.T) {
	pol := rotation.CooldownPolicy{Default: time.Minute, Max: 10 * time.Minute}
	s, clk := newTestStore(t, StoreOptions{Cooldown: pol, SiteFailureRest: 5 * time.Second, MaxTTL: time.Hour}, "a", "b")
	l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "dead.example", TTL: time.Hour})
	mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
	clk.Step(time.Minute) // the ban window ended; its strike is remembered
	mustReport(t, s, l.ID, Report{Result: rotation.ResultTargetUnreachable})
	mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "other.example"}) // in service for every other site
	_, err := s.Acquire(context.Background(), AcquireRequest{Proxy: "a", Target: "dead.example"})
	if nm := noMatch(t, err); nm.InCooldown != 1 {
		t.Fatalf("a for the dead site: %+v, want in cooldown", nm)
	}
	st := s.Members()[0]
	if _, global := st.Cooldowns[""]; global || st.Cooldowns["dead.example"].Sub(clk.Now()) != 5*time.Second {
		t.Fatalf("a's cooldowns = %v, want only dead.example for 5s", st.Cooldowns)
	}
	clk.Step(5 * time.Second)
	mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "dead.example"})
	// The rest was no strike: the next ban after it doubles from the one
	// strike before (2m), it does not count three.
	mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
	if left := s.Members()[0].Cooldowns["dead.example"].Sub(clk.Now()); left != 2*time.Minute {
		t.Fatalf("ban after a site failure: window %v, want 2m (second strike)", left)
	}
}

func TestStoreGlobalCooldownEndsOnTime(t *testing.T) {
	// A member cooling down for every target waits outside the selection
	// index; it must come back exactly when its window ends, also when a
	// second failure extended the window meanwhile.
	s, clk := newTestStore(t, StoreOptions{FailureWindow: 30 * time.Second}, "a", "b")
	l := mustAcquire(t, s, AcquireRequest{Target: "site.com"})
	if l.Member.Name != "a" {
		t.Fatalf("first lease on %s, want a (name order)", l.Member.Name)
	}
	_ = s.Release(context.Background(), l.ID)
	chosen := func() string {
		t.Helper()
		l := mustAcquire(t, s, AcquireRequest{Target: "site.com"})
		_ = s.Release(context.Background(), l.ID)
		return l.Member.Name
	}
	mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
	steps := []struct {
		name    string
		advance time.Duration
		extend  bool // report another failure on a's lease first
		want    string
	}{
		{"inside the window", 10 * time.Second, false, "b"},
		{"extended 20s into the window", 10 * time.Second, true, "b"},
		{"past the first window, inside the extended one", 15 * time.Second, false, "b"},
		{"when the extended window ends", 5 * time.Second, false, "a"},
	}
	for _, st := range steps {
		if st.extend {
			mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
		}
		clk.Step(st.advance)
		if got := chosen(); got != st.want {
			t.Errorf("%s: chose %s, want %s", st.name, got, st.want)
		}
	}
}

func TestStoreReportTargetFallback(t *testing.T) {
	tests := []struct {
		name        string
		leaseTarget string
		reportTgt   string
		wantKey     string
	}{
		{"report target wins", "lease.com", "report.com", "report.com"},
		{"lease target when the report has none", "lease.com", "", "lease.com"},
		{"global when neither has one", "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t, StoreOptions{}, "a")
			l := mustAcquire(t, s, AcquireRequest{Target: tc.leaseTarget})
			mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned, Target: tc.reportTgt})
			cd := s.Members()[0].Cooldowns
			if len(cd) != 1 {
				t.Fatalf("cooldowns = %v, want exactly one", cd)
			}
			if _, ok := cd[tc.wantKey]; !ok {
				t.Errorf("cooldowns = %v, want key %q", cd, tc.wantKey)
			}
		})
	}
}

func TestStoreLeaseExpiryUsesTheClock(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{MaxLeasesPerMember: 1}, "a")
	mustAcquire(t, s, AcquireRequest{TTL: 10 * time.Second})
	if _, err := s.Acquire(context.Background(), AcquireRequest{}); noMatch(t, err).AtCapacity != 1 {
		t.Fatal("second lease granted over capacity")
	}
	if n := s.ActiveLeases(); n != 1 {
		t.Fatalf("ActiveLeases = %d, want 1", n)
	}
	clk.Step(10 * time.Second) // no sweep runs: reads must check expiry
	if n := s.ActiveLeases(); n != 0 {
		t.Errorf("ActiveLeases after expiry = %d, want 0", n)
	}
	if st := s.Members(); st[0].ActiveLeases != 0 {
		t.Errorf("member active leases after expiry = %d, want 0", st[0].ActiveLeases)
	}
	mustAcquire(t, s, AcquireRequest{})
}

func TestStoreLateReportWindow(t *testing.T) {
	pol := rotation.CooldownPolicy{Default: time.Minute, Max: 10 * time.Minute}
	t.Run("expired lease", func(t *testing.T) {
		s, clk := newTestStore(t, StoreOptions{Cooldown: pol}, "a")
		l := mustAcquire(t, s, AcquireRequest{Target: "site.com", TTL: time.Minute})
		clk.Step(time.Minute + 10*time.Minute - time.Nanosecond)
		mustReport(t, s, l.ID, Report{Result: rotation.ResultRateLimited})
		if _, ok := s.Members()[0].Cooldowns["site.com"]; !ok {
			t.Error("late report did not start a cooldown")
		}
		clk.Step(time.Nanosecond)
		if err := s.Report(context.Background(), l.ID, Report{Result: rotation.ResultOK}); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("report past the window = %v, want ErrUnknownLease", err)
		}
	})
	t.Run("released lease", func(t *testing.T) {
		s, clk := newTestStore(t, StoreOptions{Cooldown: pol}, "a")
		l := mustAcquire(t, s, AcquireRequest{Target: "site.com", TTL: time.Hour})
		_ = s.Release(context.Background(), l.ID)
		clk.Step(5 * time.Minute)
		mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
		clk.Step(5 * time.Minute) // window counts from the release, not the TTL
		if err := s.Report(context.Background(), l.ID, Report{Result: rotation.ResultOK}); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("report 10m after release = %v, want ErrUnknownLease", err)
		}
	})
	t.Run("released leases retained are bounded", func(t *testing.T) {
		s, _ := newTestStore(t, StoreOptions{ReleasedRetained: 2}, "a")
		var ids []string
		for range 3 {
			l := mustAcquire(t, s, AcquireRequest{})
			ids = append(ids, l.ID)
			_ = s.Release(context.Background(), l.ID)
		}
		if err := s.Report(context.Background(), ids[0], Report{Result: rotation.ResultOK}); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("oldest released lease: %v, want ErrUnknownLease", err)
		}
		for _, id := range ids[1:] {
			mustReport(t, s, id, Report{Result: rotation.ResultOK})
		}
		if n := s.leaseCount(); n != 2 {
			t.Errorf("store holds %d leases, want 2", n)
		}
	})
}

func TestStoreReportErrors(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{}, "a")
	l := mustAcquire(t, s, AcquireRequest{})
	if err := s.Report(context.Background(), "nope", Report{Result: rotation.ResultOK}); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("unknown lease: %v, want ErrUnknownLease", err)
	}
	if err := s.Report(context.Background(), l.ID, Report{Result: "meh"}); !errors.Is(err, ErrInvalidResult) {
		t.Errorf("invalid result: %v, want ErrInvalidResult", err)
	}
	if cd := s.Members()[0].Cooldowns; cd != nil {
		t.Errorf("cooldowns after rejected reports = %v, want none", cd)
	}
	// Report never ends the lease.
	mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
	if n := s.ActiveLeases(); n != 1 {
		t.Errorf("ActiveLeases after report = %d, want 1", n)
	}
}

func TestStoreReleaseIsIdempotent(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{}, "a")
	l := mustAcquire(t, s, AcquireRequest{})
	for range 3 {
		if err := s.Release(context.Background(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(context.Background(), "unknown"); err != nil {
		t.Fatal(err)
	}
	if n := s.ActiveLeases(); n != 0 {
		t.Errorf("ActiveLeases = %d, want 0", n)
	}
}

func TestStoreSetMembersReload(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{}, "a", "b", "c")
	s.SetHealth("a", false, 0)
	lb := mustAcquire(t, s, AcquireRequest{Proxy: "b", Target: "site.com"})
	mustReport(t, s, lb.ID, Report{Result: rotation.ResultBanned})
	lc := mustAcquire(t, s, AcquireRequest{Proxy: "c", Target: "site.com"})

	// Reload: a and b kept, c removed, d added; b's attributes change (not its endpoint).
	b := proxyMember(t, "b", "tier", "dc")
	s.SetMembers([]Member{proxyMember(t, "a"), b, proxyMember(t, "d")})
	b.Attributes["tier"] = "mutated" // the store keeps its own copy

	st := s.Members()
	if len(st) != 3 || st[0].Name != "a" || st[1].Name != "b" || st[2].Name != "d" {
		t.Fatalf("Members = %+v, want a, b, d", st)
	}
	if st[0].Healthy {
		t.Error("a's unhealthy verdict did not survive the reload")
	}
	if _, ok := st[1].Cooldowns["site.com"]; !ok || st[1].Attributes["tier"] != "dc" {
		t.Errorf("b after reload = %+v, want its cooldown and tier=dc", st[1])
	}
	if !st[2].Healthy {
		t.Error("a new member must start healthy")
	}
	// c is never chosen again, but its lease stays reportable and releasable.
	for range 4 {
		if l := mustAcquire(t, s, AcquireRequest{Target: "x.com"}); l.Member.Name == "c" {
			t.Fatal("removed member c chosen")
		}
	}
	if _, err := s.Acquire(context.Background(), AcquireRequest{Proxy: "c"}); noMatch(t, err).Considered != 0 {
		t.Error("pin to a removed member must consider nothing")
	}
	mustReport(t, s, lc.ID, Report{Result: rotation.ResultBanned})
	before := s.ActiveLeases()
	_ = s.Release(context.Background(), lc.ID)
	if after := s.ActiveLeases(); after != before-1 {
		t.Errorf("ActiveLeases %d -> %d after releasing the removed member's lease, want -1", before, after)
	}

	// An endpoint change under the same name is a new upstream: fresh state.
	moved := proxyMember(t, "b")
	moved.URL.Host = "127.0.0.9:3128"
	s.SetMembers([]Member{proxyMember(t, "a"), moved})
	if st := s.Members(); st[1].Cooldowns != nil || st[1].URL.Host != "127.0.0.9:3128" {
		t.Errorf("b with a new endpoint = %+v, want no cooldowns", st[1])
	}
}

func TestStoreSweepFreesMemoryOnly(t *testing.T) {
	pol := rotation.CooldownPolicy{Default: time.Minute, Max: 10 * time.Minute}
	s, clk := newTestStore(t, StoreOptions{Cooldown: pol}, "a")
	l1 := mustAcquire(t, s, AcquireRequest{Target: "t", TTL: time.Minute})
	mustReport(t, s, l1.ID, Report{Result: rotation.ResultBanned})
	l2 := mustAcquire(t, s, AcquireRequest{Target: "u", TTL: time.Hour})

	clk.Step(5 * time.Minute)
	s.sweep()
	if n := s.leaseCount(); n != 2 {
		t.Fatalf("sweep dropped a lease still inside its report window (%d left)", n)
	}
	clk.Step(6 * time.Minute) // l1 ended 11m ago, its cooldown 10m ago
	s.sweep()
	if _, e := s.lookup(l1.ID); e != nil {
		t.Error("sweep kept a lease past its report window")
	}
	if _, e := s.lookup(l2.ID); e == nil {
		t.Error("sweep dropped a live lease")
	}
	if n := len(s.members["a"].cool); n != 0 {
		t.Errorf("sweep kept %d forgotten cooldowns", n)
	}
	if n := s.ActiveLeases(); n != 1 {
		t.Errorf("ActiveLeases = %d, want 1", n)
	}
}

func TestStoreStartStopsWithContext(t *testing.T) {
	s := NewStore(StoreOptions{SweepInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Start(ctx); close(done) }()
	time.Sleep(5 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Start did not return after the context ended")
	}
}

func TestStoreConcurrentUse(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	s := NewStore(StoreOptions{MaxLeasesPerMember: 50, SweepInterval: time.Millisecond})
	var ms []Member
	for _, n := range names {
		ms = append(ms, proxyMember(t, n))
	}
	s.SetMembers(ms)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Start(ctx)

	results := []rotation.Result{rotation.ResultOK, rotation.ResultRateLimited, rotation.ResultBanned, rotation.ResultUpstreamFailed, rotation.ResultTargetUnreachable}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				target := fmt.Sprintf("site%d.com", (g+i)%7)
				l, err := s.Acquire(ctx, AcquireRequest{Target: target, TTL: time.Duration(1+i%3) * time.Second})
				if err != nil {
					var nm *NoMatchError
					if !errors.As(err, &nm) {
						t.Errorf("Acquire: %v", err)
						return
					}
					continue
				}
				if i%5 == 0 {
					r := Report{Result: results[i%len(results)], RetryAfter: time.Millisecond}
					if err := s.Report(ctx, l.ID, r); err != nil {
						t.Errorf("Report: %v", err)
					}
				}
				if i%3 != 0 {
					_ = s.Release(ctx, l.ID)
				}
				switch i % 50 {
				case 10:
					s.SetHealth(names[i%4], i%100 != 10, time.Millisecond)
				case 20:
					_ = s.Members()
					_ = s.ActiveLeases()
					_ = s.ActiveCooldowns()
				case 30:
					s.SetMembers(ms)
				}
			}
		})
	}
	wg.Wait()
	for _, st := range s.Members() {
		if st.ActiveLeases > 50 {
			t.Errorf("%s has %d active leases, over the cap of 50", st.Name, st.ActiveLeases)
		}
	}
}
