package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// recentBanner is the read-only query both stores answer for a ProxyPool's
// recycling.
type recentBanner interface {
	RecentBans(ctx context.Context, window time.Duration) ([]pool.Cooldown, error)
}

func TestStoreContractRecentBansListsEachSitesBanWithinTheWindow(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{
			Cooldown:        rotation.CooldownPolicy{Default: 300 * time.Millisecond, Max: time.Hour},
			FailureWindow:   300 * time.Millisecond,
			SiteFailureRest: 300 * time.Millisecond,
		}
		s := mk(o, "a", "b", "c")
		rb, ok := s.(recentBanner)
		if !ok {
			t.Fatalf("%T has no RecentBans", s)
		}
		la := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "shop.com"})
		lb := cAcquire(t, s, pool.AcquireRequest{Proxy: "b", Target: "shop.com"})
		lc := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "shop.com"})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultBanned})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultRateLimited, Target: "news.com"})
		// Neither a rest for a site the member could not reach nor its own
		// failure for every site is a ban.
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultTargetUnreachable, Target: "dead.com"})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultUpstreamFailed, Target: ""})
		cReport(t, s, lb.ID, pool.Report{Result: rotation.ResultOK})
		cReport(t, s, lc.ID, pool.Report{Result: rotation.ResultRateLimited, Target: "maps.com"})

		list := func(window time.Duration) string {
			t.Helper()
			cs, err := rb.RecentBans(context.Background(), window)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, c := range cs {
				if time.Until(c.Until) > time.Second {
					t.Fatalf("%+v: until is %v from now", c, time.Until(c.Until))
				}
				out = append(out, c.Member+"@"+c.Target+"="+string(c.Reason))
			}
			return fmt.Sprint(out)
		}
		if got, want := list(time.Hour), "[c@maps.com=rate_limited a@news.com=rate_limited a@shop.com=banned]"; got != want {
			t.Fatalf("running bans:\n got %s\nwant %s", got, want)
		}
		// The windows end; within an hour they are still recent, within a
		// window shorter than the time since they ended they are not.
		waitNoCooldown(t, s, "a", "shop.com")
		waitNoCooldown(t, s, "a", "news.com")
		waitNoCooldown(t, s, "c", "maps.com")
		time.Sleep(600 * time.Millisecond)
		if got, want := list(time.Hour), "[c@maps.com=rate_limited a@news.com=rate_limited a@shop.com=banned]"; got != want {
			t.Fatalf("bans ended within the window:\n got %s\nwant %s", got, want)
		}
		if got := list(200 * time.Millisecond); got != "[]" {
			t.Fatalf("bans that ended before a 200ms window: %s, want none", got)
		}
		// A member the store no longer has is nobody's to recycle.
		s.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b")})
		poll.Until(t, 10*time.Second, "the departed member's bans dropped", func() error {
			if got, want := list(time.Hour), "[a@news.com=rate_limited a@shop.com=banned]"; got != want {
				return fmt.Errorf("after c left: %s, want %s", got, want)
			}
			return nil
		})
	})
}
