package pool

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// failAll reports an upstream failure on a fresh lease of each named
// member, a second apart, so they fail in that order.
func failAll(t *testing.T, s *Store, clk interface{ Step(time.Duration) }, names ...string) {
	t.Helper()
	for _, n := range names {
		l := mustAcquire(t, s, AcquireRequest{Proxy: n, Target: "failed.example"})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
		clk.Step(time.Second)
	}
}

// failureResting names the members whose cooldown for every target is a
// failure rest.
func failureResting(t *testing.T, s *Store) []string {
	t.Helper()
	cds, _ := s.ListCooldowns(context.Background())
	var out []string
	for _, cd := range cds {
		if cd.Target == "" && cd.Reason == rotation.ResultUpstreamFailed {
			out = append(out, cd.Member)
		}
	}
	slices.Sort(out)
	return out
}

func TestStoreFailureRests(t *testing.T) {
	four := []string{"a", "b", "c", "d"}
	tests := []struct {
		name string
		opts StoreOptions
		run  func(t *testing.T, s *Store, clk interface{ Step(time.Duration) })
		// resting are the members resting for their own failures after run.
		resting []string
	}{
		{"four failing at once: half rest, the latest failures", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a", "b", "c", "d")
		}, []string{"c", "d"}},
		{"at 100 percent every member may rest", StoreOptions{FailureRest: rotation.FailureRest{MaxPercent: 100}}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a", "b", "c", "d")
		}, four},
		{"a member failing again does not evict another", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a", "b", "b", "a")
		}, []string{"a", "b"}},
		{"an unhealthy member counts neither as resting nor in the pool", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a")
			s.SetHealth("c", false, 0)
			s.SetHealth("d", false, 0)
			// a rests; of the two healthy ones, one may: b's failure evicts a.
			failAll(t, s, clk, "b")
		}, []string{"b"}},
		{"an ok report ends a failure rest", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.example"})
			mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
			failAll(t, s, clk, "b")
			mustReport(t, s, l.ID, Report{Result: rotation.ResultOK})
		}, []string{"b"}},
		{"an answered report ends a failure rest", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.example"})
			mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
			mustReport(t, s, l.ID, Report{Result: rotation.ResultAnswered})
		}, nil},
		{"a passing probe (Answered) ends a failure rest", StoreOptions{}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a", "b")
			s.Answered("a")
			s.Answered("nobody") // an unknown name changes nothing
		}, []string{"b"}},
		{"the rest ends by itself after the window", StoreOptions{FailureWindow: 5 * time.Second}, func(t *testing.T, s *Store, clk interface{ Step(time.Duration) }) {
			failAll(t, s, clk, "a")
			clk.Step(5 * time.Second)
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, clk := newTestStore(t, tt.opts, four...)
			tt.run(t, s, clk)
			if got := failureResting(t, s); !slices.Equal(got, tt.resting) {
				t.Fatalf("resting for their own failures: %v, want %v", got, tt.resting)
			}
			// A member that no longer rests is leased again by name, one that
			// does only marked.
			for _, st := range s.Members() {
				n := st.Name
				if !st.Healthy {
					continue
				}
				l, err := s.Acquire(context.Background(), AcquireRequest{Proxy: n, Target: "other.example"})
				if err != nil {
					t.Fatalf("Acquire(%s): %v", n, err)
				}
				if l.FailureRest != slices.Contains(tt.resting, n) {
					t.Fatalf("lease of %s marked FailureRest=%v, resting %v", n, l.FailureRest, tt.resting)
				}
			}
		})
	}
}

func TestStoreFailureRestOverride(t *testing.T) {
	ctx := context.Background()
	all := StoreOptions{FailureRest: rotation.FailureRest{MaxPercent: 100}, Cooldown: rotation.CooldownPolicy{Default: time.Hour}}

	t.Run("every member resting: the least recently failed is leased, marked", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a", "b", "c")
		failAll(t, s, clk, "b", "c", "a")
		var got []string
		for range 3 {
			l := mustAcquire(t, s, AcquireRequest{Target: "site.example"})
			if !l.FailureRest {
				t.Fatalf("override lease of %s not marked FailureRest", l.Member.Name)
			}
			got = append(got, l.Member.Name)
			// It fails again: the next override goes to another member.
			mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
			clk.Step(time.Second)
		}
		if want := []string{"b", "c", "a"}; !slices.Equal(got, want) {
			t.Fatalf("override order %v, want %v (least recently failed first)", got, want)
		}
	})

	t.Run("a ban is never overridden", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a", "b")
		l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.example"})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned})
		failAll(t, s, clk, "a", "b")
		got := mustAcquire(t, s, AcquireRequest{Target: "site.example"})
		if got.Member.Name != "b" || !got.FailureRest {
			t.Fatalf("leased %s (FailureRest %v), want b: a is banned for the site", got.Member.Name, got.FailureRest)
		}
		mustReport(t, s, got.ID, Report{Result: rotation.ResultUpstreamFailed})
		// b rests again and a is banned: b is still the only choice, and
		// answered on a lifts no ban.
		mustReport(t, s, l.ID, Report{Result: rotation.ResultAnswered})
		for range 3 {
			if got := mustAcquire(t, s, AcquireRequest{Target: "site.example"}); got.Member.Name != "b" {
				t.Fatalf("leased %s for the site a is banned from", got.Member.Name)
			}
		}
		if until := s.Members()[0].Cooldowns["site.example"]; until.IsZero() {
			t.Fatal("a's ban for the site was lifted")
		}
	})

	t.Run("a ban for every target stays a ban when the member also fails", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a")
		l := mustAcquire(t, s, AcquireRequest{Proxy: "a"})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultBanned}) // no target: every target
		mustReport(t, s, l.ID, Report{Result: rotation.ResultUpstreamFailed})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultAnswered})
		clk.Step(time.Minute)
		if _, err := s.Acquire(ctx, AcquireRequest{Target: "site.example"}); err == nil {
			t.Fatal("a member banned for every target was leased")
		} else if nm := noMatch(t, err); nm.InCooldown != 1 {
			t.Fatalf("refusal %+v, want the member in cooldown", nm)
		}
	})

	t.Run("a site rest is never overridden", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a")
		l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.example"})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultTargetUnreachable})
		failAll(t, s, clk, "a")
		if _, err := s.Acquire(ctx, AcquireRequest{Target: "site.example"}); err == nil {
			t.Fatal("a member resting for the site was leased for it")
		}
		if l := mustAcquire(t, s, AcquireRequest{Target: "other.example"}); !l.FailureRest {
			t.Fatal("the override for another site is not marked")
		}
	})

	t.Run("an unhealthy member is never overridden", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a", "b")
		failAll(t, s, clk, "a", "b")
		s.SetHealth("a", false, 0)
		s.SetHealth("b", false, 0)
		if _, err := s.Acquire(ctx, AcquireRequest{Target: "site.example"}); err == nil {
			t.Fatal("an unhealthy member was leased")
		}
	})

	t.Run("a member named by the request is overridden too", func(t *testing.T) {
		s, clk := newTestStore(t, StoreOptions{}, "a", "b")
		failAll(t, s, clk, "a")
		if l := mustAcquire(t, s, AcquireRequest{Proxy: "a", Target: "site.example"}); !l.FailureRest {
			t.Fatal("a pinned resting member leased without the mark")
		}
	})

	t.Run("with a member that does not rest, it is chosen and nothing is overridden", func(t *testing.T) {
		s, clk := newTestStore(t, all, "a", "b")
		failAll(t, s, clk, "a")
		for range 4 {
			if l := mustAcquire(t, s, AcquireRequest{Target: "site.example"}); l.Member.Name != "b" || l.FailureRest {
				t.Fatalf("leased %s (FailureRest %v), want b", l.Member.Name, l.FailureRest)
			}
		}
	})
}
