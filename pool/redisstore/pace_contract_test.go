package redisstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The contract of pool.SitePacer, on the memory store and every Redis
// topology: the pace a fleet shares through its lease store.

// runPaceContract runs fn per backend with a fresh store's pacer.
func runPaceContract(t *testing.T, fn func(t *testing.T, p pool.SitePacer)) {
	for _, b := range contractBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			p, ok := b.make(t, pool.StoreOptions{}).(pool.SitePacer)
			if !ok {
				t.Fatalf("the %s store keeps no pace (no pool.SitePacer)", b.name)
			}
			fn(t, p)
		})
	}
}

func reserve(t *testing.T, p pool.SitePacer, req pool.SlotRequest) pool.Slot {
	t.Helper()
	s, err := p.ReserveSlot(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func answered(t *testing.T, p pool.SitePacer, a pool.SiteAnswer) rotation.LearntPace {
	t.Helper()
	l, err := p.SiteAnswered(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// near reports whether got is want, less at most the time the test took
// since (a loaded machine), and never more.
func near(got, want time.Duration) bool {
	return got <= want && got >= want-400*time.Millisecond
}

func TestPaceContractMinIntervalPerMemberAndSite(t *testing.T) {
	runPaceContract(t, func(t *testing.T, p pool.SitePacer) {
		ctx := context.Background()
		const iv = 2 * time.Second
		req := pool.SlotRequest{Site: "a.example", Member: "m1", MinInterval: iv, MaxWait: 10 * time.Second}
		if s := reserve(t, p, req); !s.Reserved || s.Wait != 0 || s.Interval != iv {
			t.Fatalf("first slot %+v, want one now at interval %v", s, iv)
		}
		second := reserve(t, p, req)
		if !second.Reserved || !near(second.Wait, iv) {
			t.Fatalf("second slot %+v, want one %v later", second, iv)
		}
		// Another member, another site: not held by m1's slots.
		for _, o := range []pool.SlotRequest{{Site: "a.example", Member: "m2", MinInterval: iv}, {Site: "b.example", Member: "m1", MinInterval: iv}} {
			if s := reserve(t, p, o); !s.Reserved || s.Wait != 0 {
				t.Fatalf("%+v: slot %+v, want one now", o, s)
			}
		}
		// Past MaxWait nothing is taken: the slot is still the third.
		short := req
		short.MaxWait = time.Second
		if s := reserve(t, p, short); s.Reserved || !near(s.Wait, 2*iv) {
			t.Fatalf("slot past max wait %+v, want refused, %v away", s, 2*iv)
		}
		// The second request leaves: its slot comes back.
		if err := p.ReturnSlot(ctx, req.Site, req.Member, second.Token); err != nil {
			t.Fatal(err)
		}
		again := reserve(t, p, req)
		if !again.Reserved || !near(again.Wait, iv) {
			t.Fatalf("slot after a return %+v, want the returned one, %v after the first", again, iv)
		}
		// A stale token gives nothing back.
		if err := p.ReturnSlot(ctx, req.Site, req.Member, second.Token+1); err != nil {
			t.Fatal(err)
		}
		third := reserve(t, p, req)
		if !third.Reserved || !near(third.Wait, 2*iv) {
			t.Fatalf("slot after a stale return %+v, want %v away", third, 2*iv)
		}
		// Two returns in a row: the last slot goes back to the one before
		// it, which then stays taken (what came before it is not known):
		// no two requests ever closer than the interval.
		for _, tok := range []int64{third.Token, again.Token} {
			if err := p.ReturnSlot(ctx, req.Site, req.Member, tok); err != nil {
				t.Fatal(err)
			}
		}
		if s := reserve(t, p, req); !s.Reserved || !near(s.Wait, 2*iv) {
			t.Fatalf("slot after two returns %+v, want %v away (the second's slot kept)", s, 2*iv)
		}
		// No interval: no pace at all.
		if s := reserve(t, p, pool.SlotRequest{Site: "c.example", Member: "m1", Auto: true}); s.Interval != 0 || s.Reserved || s.Wait != 0 {
			t.Fatalf("unpaced site: %+v", s)
		}
	})
}

func TestPaceContractPlacesInFlight(t *testing.T) {
	runPaceContract(t, func(t *testing.T, p pool.SitePacer) {
		ctx := context.Background()
		enter := func(holder string, want bool) {
			t.Helper()
			in, err := p.EnterSite(ctx, "s.example", holder, 2)
			if err != nil {
				t.Fatal(err)
			}
			if in != want {
				t.Fatalf("enter %s: %v, want %v", holder, in, want)
			}
		}
		enter("a", true)
		enter("b", true)
		enter("c", false)
		enter("b", true) // already in: still in, no second place
		if in, _ := p.EnterSite(ctx, "other.example", "c", 2); !in {
			t.Fatal("a full site held another")
		}
		if err := p.LeaveSite(ctx, "s.example", "a"); err != nil {
			t.Fatal(err)
		}
		enter("c", true)
		enter("a", false)
		if err := p.LeaveSite(ctx, "s.example", "nobody"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPaceContractLearntPaceIsAIMDSharedByAll(t *testing.T) {
	runPaceContract(t, func(t *testing.T, p pool.SitePacer) {
		ctx := context.Background()
		const site = "bans.example"
		if l := answered(t, p, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultOK}); l.Slowed() {
			t.Fatalf("an ok slowed a site: %+v", l)
		}
		if got, _ := p.SlowedSites(ctx); len(got) != 0 {
			t.Fatalf("slowed sites %v before any ban", got)
		}
		first := answered(t, p, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultRateLimited})
		if first.Interval != rotation.PaceFirstCut || first.Cuts != 1 || first.Cause != rotation.ResultRateLimited {
			t.Fatalf("first cut %+v, want %v by rate_limited", first, rotation.PaceFirstCut)
		}
		if got, _ := p.SlowedSites(ctx); !slices.Equal(got, []string{site}) {
			t.Fatalf("slowed sites %v, want [%s]", got, site)
		}
		// No news: the same member again, a request paced before the cut.
		for _, a := range []pool.SiteAnswer{{Member: "m1", SeenCuts: 1}, {Member: "m2", SeenCuts: 0}} {
			a.Site, a.Result = site, rotation.ResultBanned
			if l := answered(t, p, a); l.Interval != first.Interval || l.Cuts != 1 {
				t.Fatalf("%+v cut again: %+v", a, l)
			}
		}
		second := answered(t, p, pool.SiteAnswer{Site: site, Member: "m4", Result: rotation.ResultBanned, SeenCuts: 1})
		if second.Interval != 2*rotation.PaceFirstCut || second.Cuts != 2 || second.Cause != rotation.ResultBanned {
			t.Fatalf("second cut %+v, want %v by banned", second, 2*rotation.PaceFirstCut)
		}
		// Additive increase, step for step as rotation defines it.
		want := second
		for range 5 {
			want = want.Answered()
			got := answered(t, p, pool.SiteAnswer{Site: site, Member: "m3", Result: rotation.ResultOK})
			if d := got.Interval - want.Interval; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("after an ok: %v, want %v", got.Interval, want.Interval)
			}
		}
		// The learnt pace holds every member's slots, but only with Auto.
		s := reserve(t, p, pool.SlotRequest{Site: site, Member: "m9", Auto: true, MaxWait: time.Minute})
		if !s.Reserved || s.Wait != 0 || s.Learnt.Cuts != 2 || s.Interval != s.Learnt.Interval {
			t.Fatalf("auto slot %+v, want one now at the learnt interval", s)
		}
		if s = reserve(t, p, pool.SlotRequest{Site: site, Member: "m9", Auto: true, MaxWait: time.Minute}); !near(s.Wait, s.Learnt.Interval) {
			t.Fatalf("second auto slot %+v, want one learnt interval later", s)
		}
		if s = reserve(t, p, pool.SlotRequest{Site: site, Member: "m9"}); s.Interval != 0 || s.Wait != 0 {
			t.Fatalf("slot without auto %+v, want no pace", s)
		}
		if _, err := p.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "m1", Result: "nonsense"}); err == nil {
			t.Fatal("an unknown result was taken")
		}
	})
}

// TestPaceContractTheRulesFirstCutPausesFloorsAndTravels: the first cut a
// gateway derived from its evidence (rotation.PaceRule.FirstCut) is what
// every store keeps and every decision follows: no member's slot before
// the pause ends, the rise stops at the floor, a later cut doubles and
// pauses again.
func TestPaceContractTheRulesFirstCutPausesFloorsAndTravels(t *testing.T) {
	runPaceContract(t, func(t *testing.T, p pool.SitePacer) {
		const site = "rule.example"
		fc := rotation.Cut{Interval: 2 * time.Second, Pause: 3 * time.Second, Floor: 1900 * time.Millisecond, Steps: 3, Memory: time.Hour}
		first := answered(t, p, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultRateLimited, FirstCut: fc})
		if first.Interval != fc.Interval || first.Pause != fc.Pause || first.Floor != fc.Floor || first.Steps != 3 || first.Memory != time.Hour || first.Cuts != 1 {
			t.Fatalf("first cut %+v, want the rule's %+v", first, fc)
		}
		// A member that never sent to the site waits for the pause's end.
		if s := reserve(t, p, pool.SlotRequest{Site: site, Member: "m2", Auto: true, MaxWait: time.Minute}); !s.Reserved || !near(s.Wait, fc.Pause) {
			t.Fatalf("slot after the cut %+v, want one at the pause's end (%v)", s, fc.Pause)
		}
		// A slot within the wait allowed is refused while the pause lasts.
		if s := reserve(t, p, pool.SlotRequest{Site: site, Member: "m3", Auto: true, MaxWait: time.Second}); s.Reserved {
			t.Fatalf("slot %+v taken within the pause", s)
		}
		want := first
		for range 4 {
			want = want.Answered()
			got := answered(t, p, pool.SiteAnswer{Site: site, Member: "m2", Result: rotation.ResultOK, SeenCuts: 1})
			if d := got.Interval - want.Interval; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("after an ok: %v, want %v", got.Interval, want.Interval)
			}
		}
		if want.Interval != fc.Floor {
			t.Fatalf("the rise went to %v, want it stopped at the floor %v", want.Interval, fc.Floor)
		}
		second := answered(t, p, pool.SiteAnswer{Site: site, Member: "m4", Result: rotation.ResultBanned, SeenCuts: 1, FirstCut: rotation.Cut{Interval: time.Millisecond}})
		if second.Interval != 2*fc.Floor || second.Floor != fc.Floor+fc.Floor/10 || second.Pause != fc.Pause || second.Cuts != 2 {
			t.Fatalf("second cut %+v, want %v floored at %v, paused again (a later cut takes the longer pause of the last and its own)", second, 2*fc.Floor, fc.Floor+fc.Floor/10)
		}
	})
}

// TestPaceContractALaterCutPausesForTheLongerOfTheLastPauseAndItsOwn: a
// first cut without a pause (the gateway saw the other members send
// nothing) lets every member go at once; a later ban, whose own cut
// carries the full pause, pauses the site for it in every store.
func TestPaceContractALaterCutPausesForTheLongerOfTheLastPauseAndItsOwn(t *testing.T) {
	runPaceContract(t, func(t *testing.T, p pool.SitePacer) {
		const site = "later.example"
		fc := rotation.Cut{Interval: 2 * time.Second, Floor: 2 * time.Second, Steps: 50}
		first := answered(t, p, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultRateLimited, FirstCut: fc})
		if first.Pause != 0 || first.Interval != fc.Interval {
			t.Fatalf("first cut %+v, want the rule's %+v", first, fc)
		}
		if s := reserve(t, p, pool.SlotRequest{Site: site, Member: "m2", Auto: true, MaxWait: time.Minute}); !s.Reserved || s.Wait > 100*time.Millisecond {
			t.Fatalf("slot after a cut without a pause %+v, want one at once", s)
		}
		own := rotation.Cut{Interval: 2 * time.Second, Pause: 5 * time.Second, Floor: 2 * time.Second, Steps: 50}
		second := answered(t, p, pool.SiteAnswer{Site: site, Member: "m2", Result: rotation.ResultBanned, SeenCuts: 1, FirstCut: own})
		if second.Cuts != 2 || second.Pause != own.Pause || second.Interval != 4*time.Second {
			t.Fatalf("second cut %+v, want 4s paused %v", second, own.Pause)
		}
		if s := reserve(t, p, pool.SlotRequest{Site: site, Member: "m3", Auto: true, MaxWait: time.Minute}); !s.Reserved || !near(s.Wait, own.Pause) {
			t.Fatalf("slot after the later cut %+v, want one at its pause's end (%v)", s, own.Pause)
		}
	})
}

// TestRedisPaceFadesByItsMemoryAndStaysListed: past the quiet period a
// learnt pace with a memory halves (rotation.LearntPace.Decayed, in the
// script), is still listed as slowed for the other gateways, and a pace
// written by the fixed rule (five fields) still reads.
func TestRedisPaceFadesByItsMemoryAndStaysListed(t *testing.T) {
	old := paceQuietArg
	paceQuietArg = (300 * time.Millisecond).Microseconds()
	t.Cleanup(func() { paceQuietArg = old })
	r := redis.Start(t, redis.Options{})
	s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "fade"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	cut := answered(t, s, pool.SiteAnswer{Site: "fade.example", Member: "m", Result: rotation.ResultBanned, FirstCut: rotation.Cut{Interval: 8 * time.Second, Floor: 4 * time.Second, Memory: time.Hour}})
	deadline := time.Now().Add(30 * time.Second)
	for {
		sl := reserve(t, s, pool.SlotRequest{Site: "fade.example", Member: "m2", Auto: true, MaxWait: time.Minute})
		if sl.Learnt.Faded == 1 {
			if sl.Learnt.Interval != cut.Interval/2 || sl.Learnt.Floor != cut.Floor/2 {
				t.Fatalf("faded once: %+v, want the interval and floor halved", sl.Learnt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never faded: %+v", sl.Learnt)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, _ := s.SlowedSites(ctx); !slices.Equal(got, []string{"fade.example"}) {
		t.Fatalf("slowed sites %v past the quiet period, want the faded site still listed", got)
	}
	l, err := parseLearnt("1000000000:1000000000:banned:1700000000000000:1")
	if err != nil || l.Interval != time.Second || l.Cuts != 1 || l.Pause != 0 {
		t.Fatalf("the fixed rule's encoding: %+v, %v", l, err)
	}
}
