package e2e

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestGatewaysOnOneStorePaceASiteTogether: two gateway processes on one
// real redis-server, in front of the same three Squids, against the site
// stand-in that bans a source after 5 requests within 2s. The pace of a
// site is the store's, so:
//   - the second gateway, which never saw a ban, obeys the pace the first
//     learnt: its burst bans no member and is spread over seconds, where an
//     unpaced burst takes a fraction of one and burns the pool;
//   - --site-min-interval 600ms on both, bursting at once, holds for their
//     sum (each alone would allow one per 600ms per member, together twice
//     the site's limit): no member banned;
//   - the same through a gateway on --lease-api: the lease API carries the
//     decision of the store that serves it.
func TestGatewaysOnOneStorePaceASiteTogether(t *testing.T) {
	bin := testutil.BuildBinary(t)
	const (
		k      = 5
		window = 2 * time.Second
		conc   = 4
	)
	squids := startSquids(t, "paceshared", "127.0.0.236", "127.0.0.237", "127.0.0.238")
	rdb := redis.Start(t, redis.Options{})
	onStore := func(extra ...string) gwConfig {
		return gwConfig{upstreams: squidURLs(squids), args: append([]string{"--cooldown", "10m",
			"--lease-store", rdb.URL(), "--lease-store-prefix", "e2e-pace"}, extra...)}
	}

	t.Run("the second gateway obeys the pace the first learnt", func(t *testing.T) {
		site := startLimitSite(t, "127.0.0.239", k, window)
		first := startGateway(t, bin, onStore())
		c1 := first.client(t, "", nil)
		c1.Timeout = 90 * time.Second
		got1 := burst(c1, site.url, 20, conc)
		banned1, inFlight := site.state()
		t.Logf("first gateway: answers %v, banned %v (in flight at the first ban %v)", got1, banned1, inFlight)
		if len(banned1) == 0 || len(banned1) == 3 {
			t.Fatalf("the first burst banned %v: want the waterfall stopped after its first ban, with members left", banned1)
		}

		second := startGateway(t, bin, onStore())
		c2 := second.client(t, "", nil)
		c2.Timeout = 90 * time.Second
		start := time.Now()
		got2 := burst(c2, site.url, 20, conc)
		d := time.Since(start)
		banned2, _ := site.state()
		t.Logf("second gateway: answers %v, banned %v, %v", got2, banned2, d)
		if !slices.Equal(banned1, banned2) {
			t.Fatalf("the second gateway's burst banned %v beyond %v: it did not obey the learnt pace", banned2, banned1)
		}
		if got2[200] != 20 {
			t.Fatalf("second gateway: answers %v, want all 20 served", got2)
		}
		// 20 requests over at most 2 members at the learnt pace (one per
		// second at the cut, a little faster with every answer since)
		// take seconds; unpaced, 20 answers of 20ms at concurrency 4 take
		// about a tenth of one.
		if d < 3*time.Second {
			t.Fatalf("the second gateway's burst took %v: not paced by what the first learnt", d)
		}
	})

	twoAtOnce := func(t *testing.T, siteHost string, a, b *gatewayProc) {
		t.Helper()
		site := startLimitSite(t, siteHost, k, window)
		var wg sync.WaitGroup
		var got [2]map[int]int
		for i, g := range []*gatewayProc{a, b} {
			c := g.client(t, "", nil)
			c.Timeout = 90 * time.Second
			wg.Go(func() { got[i] = burst(c, site.url, 24, conc) })
		}
		wg.Wait()
		banned, _ := site.state()
		t.Logf("answers %v and %v, banned %v", got[0], got[1], banned)
		if len(banned) != 0 || got[0][200] != 24 || got[1][200] != 24 {
			t.Fatalf("answers %v and %v, banned %v: want all served and nobody banned", got[0], got[1], banned)
		}
	}
	t.Run("an explicit min interval holds across both gateways", func(t *testing.T) {
		twoAtOnce(t, "127.0.0.240", startGateway(t, bin, onStore("--site-min-interval", "600ms")), startGateway(t, bin, onStore("--site-min-interval", "600ms")))
	})
	t.Run("a --lease-api gateway is paced by the store behind the lease API", func(t *testing.T) {
		served := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), api: true, args: []string{"--cooldown", "10m", "--site-min-interval", "600ms"}})
		remote := startGateway(t, bin, gwConfig{args: poolAPIArgs(t, "http://"+served.apiAddr, served.apiToken, "--site-min-interval", "600ms")})
		twoAtOnce(t, "127.0.0.241", served, remote)
	})
}
