package redisstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// failureResting names the members whose cooldown for every target is a
// rest for their own failures.
func failureResting(t *testing.T, s pool.LeaseStore) []string {
	t.Helper()
	cds, err := s.ListCooldowns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, cd := range cds {
		if cd.Target == "" && cd.Reason == rotation.ResultUpstreamFailed {
			out = append(out, cd.Member)
		}
	}
	slices.Sort(out)
	return out
}

// failInOrder reports an upstream failure of each named member, a few
// milliseconds apart so the stores' millisecond clocks order them.
func failInOrder(t *testing.T, s pool.LeaseStore, names ...string) {
	t.Helper()
	for _, n := range names {
		l := cAcquire(t, s, pool.AcquireRequest{Proxy: n, Target: "failed.example"})
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStoreContractFailureRestsKeepTheirShare holds every backend with one
// member group to rotation.FailureRest's share and to answers ending a
// rest. (A Redis store with member groups keeps the share per group: a
// script sees one group's members.)
func TestStoreContractFailureRestsKeepTheirShare(t *testing.T) {
	runContractOn(t, func(b contractBackend) bool { return !b.sharded }, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{FailureWindow: time.Hour, Cooldown: rotation.CooldownPolicy{Default: time.Hour}}
		s := mk(o, "a", "b", "c", "d")
		failInOrder(t, s, "a", "b", "c", "d")
		if got := failureResting(t, s); !slices.Equal(got, []string{"c", "d"}) {
			t.Fatalf("after four failures %v rest, want the latest two [c d]", got)
		}
		l := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "x.example"})
		if !l.FailureRest {
			t.Fatal("a pinned lease of a resting member is not marked")
		}
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultAnswered})
		ok := cAcquire(t, s, pool.AcquireRequest{Proxy: "d", Target: "x.example"})
		cReport(t, s, ok.ID, pool.Report{Result: rotation.ResultOK})
		if got := failureResting(t, s); len(got) != 0 {
			t.Fatalf("after answered and ok %v still rest", got)
		}
		if as, isAS := s.(pool.AnswerSink); !isAS {
			t.Fatalf("%T is no pool.AnswerSink: a passing probe cannot end a rest", s)
		} else {
			failInOrder(t, s, "a")
			as.Answered("a")
			if got := failureResting(t, s); len(got) != 0 {
				t.Fatalf("after a passing probe %v still rest", got)
			}
		}
	})
}

// TestStoreContractFailureRestOverride holds every backend to the
// override: with nothing else left, the least recently failed resting
// member is leased, marked, and a ban is never overridden or lifted.
func TestStoreContractFailureRestOverride(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		ctx := context.Background()
		all := pool.StoreOptions{FailureWindow: time.Hour, Cooldown: rotation.CooldownPolicy{Default: time.Hour}, FailureRest: rotation.FailureRest{MaxPercent: 100}}
		s := mk(all, "a", "b", "c")
		ban := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "site.example"})
		cReport(t, s, ban.ID, pool.Report{Result: rotation.ResultBanned})
		failInOrder(t, s, "b", "c", "a")
		var got []string
		for range 3 {
			l, err := s.Acquire(ctx, pool.AcquireRequest{Target: "site.example"})
			if err != nil {
				t.Fatalf("every member resting for its failures: %v, want an override lease", err)
			}
			if !l.FailureRest || l.Member.Name == "c" {
				t.Fatalf("leased %s (FailureRest %v): c is banned for the site", l.Member.Name, l.FailureRest)
			}
			got = append(got, l.Member.Name)
			cReport(t, s, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
			time.Sleep(5 * time.Millisecond)
		}
		if want := []string{"b", "a", "b"}; !slices.Equal(got, want) {
			t.Fatalf("overrides went to %v, want %v (least recently failed first, c banned)", got, want)
		}
		cReport(t, s, ban.ID, pool.Report{Result: rotation.ResultAnswered})
		if _, banned := memberStatus(t, s, "c").Cooldowns["site.example"]; !banned {
			t.Fatal("answered lifted c's ban for the site")
		}
	})
}
