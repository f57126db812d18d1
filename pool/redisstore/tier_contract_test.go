package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The contract of pool.SiteTierKeeper, on the memory store and every Redis
// topology: a site's place on the tiers, shared through the lease store.

// testTierRule climbs after three bans and holds a second, so that a test
// sees a probe without waiting half an hour.
var testTierRule = rotation.TierRule{Threshold: 3, Window: time.Minute, Hold: time.Second, ProbeEvery: time.Second}

var threeTiers = rotation.TierRange{Lo: 0, Hi: 2}

func runTierContract(t *testing.T, fn func(t *testing.T, k pool.SiteTierKeeper)) {
	for _, b := range contractBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			k, ok := b.make(t, pool.StoreOptions{}).(pool.SiteTierKeeper)
			if !ok {
				t.Fatalf("the %s store keeps no tiers (no pool.SiteTierKeeper)", b.name)
			}
			fn(t, k)
		})
	}
}

func startTier(t *testing.T, k pool.SiteTierKeeper, site string, rg rotation.TierRange) pool.TierStart {
	t.Helper()
	st, err := k.StartTier(context.Background(), site, rg, testTierRule)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func tierAnswered(t *testing.T, k pool.SiteTierKeeper, site string, st pool.TierStart, res rotation.Result) rotation.SiteTier {
	t.Helper()
	p, err := k.TierAnswered(context.Background(), pool.TierAnswer{Site: site, Level: st.Level, SeenMoves: st.Moves, Result: res, Rule: testTierRule, Top: 2})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTierContractBansClimbAndAProbeServedStepsDown(t *testing.T) {
	runTierContract(t, func(t *testing.T, k pool.SiteTierKeeper) {
		const site = "a.example"
		first := startTier(t, k, site, threeTiers)
		if first.Level != 0 || first.Probe || first.Moves != 0 {
			t.Fatalf("a new site starts at %+v, want the cheapest tier", first)
		}
		var inFlight []pool.TierStart
		for range 3 {
			inFlight = append(inFlight, startTier(t, k, site, threeTiers))
		}
		for i, st := range inFlight[:2] {
			if p := tierAnswered(t, k, site, st, rotation.ResultBanned); p.Level != 0 || p.Bans != i+1 {
				t.Fatalf("after ban %d the site is at %+v, want tier 0 with %d bans", i+1, p, i+1)
			}
		}
		if p := tierAnswered(t, k, site, inFlight[2], rotation.ResultRateLimited); p.Level != 1 || p.Moves != 1 {
			t.Fatalf("after the third ban the site is at %+v, want tier 1, one move", p)
		}
		// A ban to a request that started before the climb is no news.
		if p := tierAnswered(t, k, site, first, rotation.ResultBanned); p.Level != 1 || p.Bans != 0 {
			t.Fatalf("a ban in flight at the climb moved the site to %+v", p)
		}
		// Another site is not touched.
		if st := startTier(t, k, "b.example", threeTiers); st.Level != 0 {
			t.Fatalf("b.example starts at %+v, want the cheapest tier", st)
		}
		// A client capped at tier 0 gets it; one allowed tier 1 and up starts there.
		if st := startTier(t, k, site, rotation.TierRange{Lo: 0, Hi: 0}); st.Level != 0 || st.Probe {
			t.Fatalf("a capped client starts at %+v, want tier 0, no probe", st)
		}
		// Within the hold, the site's tier; after it, one probe of the tier below.
		var probe pool.TierStart
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := startTier(t, k, site, threeTiers)
			if st.Probe {
				probe = st
				break
			}
			if st.Level != 1 {
				t.Fatalf("the site starts at %+v within its hold, want tier 1", st)
			}
			if time.Now().After(deadline) {
				t.Fatal("no probe 30 s into a hold of 1 s")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if probe.Level != 0 {
			t.Fatalf("the probe starts at %+v, want tier 0", probe)
		}
		// The probe served: the site steps down.
		if p := tierAnswered(t, k, site, probe, rotation.ResultOK); p.Level != 0 || p.Moves != 2 || p.Climbs != 1 {
			t.Fatalf("after the probe was served the site is at %+v, want tier 0, two moves, one climb kept", p)
		}
	})
}

func TestTierContractOneProbePerProbeEvery(t *testing.T) {
	runTierContract(t, func(t *testing.T, k pool.SiteTierKeeper) {
		const site = "probed.example"
		for range 3 {
			tierAnswered(t, k, site, startTier(t, k, site, threeTiers), rotation.ResultBanned)
		}
		time.Sleep(testTierRule.Hold + 100*time.Millisecond)
		// Eight callers at once: one probe, unless the calls took longer
		// than ProbeEvery to run (a loaded machine), then one per ProbeEvery.
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			probes int
		)
		began := time.Now()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := k.StartTier(context.Background(), site, threeTiers, testTierRule)
				if err != nil {
					t.Error(err)
					return
				}
				if st.Probe {
					mu.Lock()
					probes++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		allowed := 1 + int(time.Since(began)/testTierRule.ProbeEvery)
		if probes < 1 || probes > allowed {
			t.Fatalf("%d probes among 8 callers in %v, want 1 to %d", probes, time.Since(began), allowed)
		}
	})
}

func TestTierContractRefusesBadAnswers(t *testing.T) {
	runTierContract(t, func(t *testing.T, k pool.SiteTierKeeper) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			a    pool.TierAnswer
			want string
		}{
			{"an unknown result", pool.TierAnswer{Site: "x", Result: "nope", Rule: testTierRule, Top: 2}, "invalid result"},
			{"a tier past the top", pool.TierAnswer{Site: "x", Level: 3, Result: rotation.ResultBanned, Rule: testTierRule, Top: 2}, "tier 3 is not one of 0 to 2"},
			{"a bad rule", pool.TierAnswer{Site: "x", Result: rotation.ResultBanned, Rule: rotation.TierRule{}, Top: 2}, "tier rule: escalate bans 0"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := k.TierAnswered(ctx, tc.a)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("TierAnswered = %v, want an error with %q", err, tc.want)
				}
			})
		}
		if st := startTier(t, k, "x", threeTiers); st.Level != 0 || st.Moves != 0 {
			t.Fatalf("after refused answers the site is at %+v, want untouched", st)
		}
	})
}

// TestTierPlaceIsSharedByGatewaysOnOneRedis: what one store client learnt,
// another on the same Redis and prefix starts by (two gateways).
func TestTierPlaceIsSharedByGatewaysOnOneRedis(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	prefix := fmt.Sprintf("tiershare%d", contractPrefixes.Add(1))
	var stores [2]*RedisStore
	for i := range stores {
		s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	const site = "shared.example"
	for range 3 {
		tierAnswered(t, stores[0], site, startTier(t, stores[0], site, threeTiers), rotation.ResultBanned)
	}
	if st := startTier(t, stores[1], site, threeTiers); st.Level != 1 || st.Moves != 1 {
		t.Fatalf("the second gateway starts the site at %+v, want tier 1 learnt by the first", st)
	}
}

func TestSiteTierEncodingRoundTrips(t *testing.T) {
	at := time.UnixMicro(1_780_000_000_123_456)
	for _, p := range []rotation.SiteTier{
		{},
		{Bans: 1, BansFrom: at},
		{Level: 2, Since: at, Bans: 2, BansFrom: at.Add(time.Second), Climbs: 3, LastProbe: at.Add(time.Minute), Moves: 7, Down: true},
	} {
		got, err := parseSiteTier(formatSiteTier(p))
		if err != nil || formatSiteTier(got) != formatSiteTier(p) || got.Level != p.Level || !got.Since.Equal(p.Since) || got.Moves != p.Moves || got.Down != p.Down {
			t.Fatalf("%+v reads back as %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{"x", "2:0:0:0:0:0:0:0:0", "1:0:0:0:0:0:0:0", "1:-1:0:0:0:0:0:0:0", "1:a:0:0:0:0:0:0:0", "1:0:0:0:0:0:0:0:2"} {
		if _, err := parseSiteTier(bad); err == nil || !strings.Contains(err.Error(), "malformed place") {
			t.Fatalf("parseSiteTier(%q) = %v, want malformed", bad, err)
		}
	}
}
