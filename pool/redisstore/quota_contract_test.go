package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// The contract of pool.QuotaKeeper, on the memory store and every Redis
// topology: clients' quotas, which hold across the gateways of one store.

func runQuotaContract(t *testing.T, fn func(t *testing.T, q pool.QuotaKeeper)) {
	for _, b := range contractBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			q, ok := b.make(t, pool.StoreOptions{}).(pool.QuotaKeeper)
			if !ok {
				t.Fatalf("the %s store keeps no quotas (no pool.QuotaKeeper)", b.name)
			}
			fn(t, q)
		})
	}
}

// refusal is err as a quota refusal, failing the test on anything else.
func refusal(t *testing.T, err error) *quota.Refusal {
	t.Helper()
	var r *quota.Refusal
	if !errors.As(err, &r) || !errors.Is(err, quota.ErrExceeded) {
		t.Fatalf("got %v, want a quota refusal", err)
	}
	return r
}

func TestQuotaContractRateRefusesPastItsBudgetAndSaysWhen(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{RPS: 0.5} // one request per 2 s, a burst of one
		if err := q.TakeRequest(ctx, "a", "s.example", l); err != nil {
			t.Fatal(err)
		}
		r := refusal(t, q.TakeRequest(ctx, "a", "other.example", l))
		if r.Which != quota.WhichRPS || r.Limit != 0.5 || r.RetryAfter <= 0 || r.RetryAfter > 2*time.Second {
			t.Fatalf("refusal %+v, want rps 0.5 with a wait in (0, 2s]", r)
		}
		if err := q.TakeRequest(ctx, "b", "s.example", l); err != nil {
			t.Fatalf("another client is refused by a's quota: %v", err)
		}
		time.Sleep(r.RetryAfter + 50*time.Millisecond)
		if err := q.TakeRequest(ctx, "a", "s.example", l); err != nil {
			t.Fatalf("after the refusal's wait: %v", err)
		}
	})
}

func TestQuotaContractBurstIsOneSecondsRequests(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{RPS: 3}
		start := time.Now()
		ok := 0
		for range 10 {
			if err := q.TakeRequest(ctx, "a", "s.example", l); err == nil {
				ok++
			} else {
				refusal(t, err)
			}
		}
		// GCRA: at most rps×T + burst in T; the calls take some of T.
		most := 3 + int(math.Ceil(time.Since(start).Seconds()*3))
		if ok < 3 || ok > most {
			t.Fatalf("%d of 10 immediate requests passed, want 3 (the burst) to %d", ok, most)
		}
	})
}

func TestQuotaContractSiteRateIsPerSiteAndARefusalTakesNothing(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{RPS: 2.5, SiteRPS: 0.01} // overall: a burst of 3; a site: a burst of 1, then one per 100 s
		if err := q.TakeRequest(ctx, "a", "a.example", l); err != nil {
			t.Fatal(err)
		}
		r := refusal(t, q.TakeRequest(ctx, "a", "a.example", l))
		if r.Which != quota.WhichSiteRPS || r.Limit != 0.01 || r.RetryAfter < 90*time.Second {
			t.Fatalf("second request to a.example: %+v, want site-rps 0.01 with a wait near 100s", r)
		}
		// The refused request took nothing of the overall rate: two more
		// sites fit in its burst of three.
		for _, site := range []string{"b.example", "c.example"} {
			if err := q.TakeRequest(ctx, "a", site, l); err != nil {
				t.Fatalf("%s after a refused a.example: %v", site, err)
			}
		}
	})
}

func TestQuotaContractLeasesAreCountedUntilReturnedOrExpired(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{Leases: 2}
		for _, h := range []string{"h1", "h2"} {
			if err := q.TakeLease(ctx, "a", h, l, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		r := refusal(t, q.TakeLease(ctx, "a", "h3", l, time.Minute))
		if r.Which != quota.WhichLeases || r.Limit != 2 || r.RetryAfter != quota.LeaseRetry {
			t.Fatalf("third lease: %+v, want leases 2", r)
		}
		if err := q.TakeLease(ctx, "b", "h1", l, time.Minute); err != nil {
			t.Fatalf("another client is refused by a's quota: %v", err)
		}
		if err := q.ReturnLease(ctx, "a", "h1"); err != nil {
			t.Fatal(err)
		}
		if err := q.ReturnLease(ctx, "a", "never-taken"); err != nil {
			t.Fatalf("returning an unknown place: %v", err)
		}
		if err := q.TakeLease(ctx, "a", "h3", l, time.Minute); err != nil {
			t.Fatalf("after a return: %v", err)
		}
		// A place nobody returns ends with its TTL.
		one := quota.Limits{Leases: 1}
		if err := q.TakeLease(ctx, "c", "h1", one, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		refusal(t, q.TakeLease(ctx, "c", "h2", one, time.Minute))
		time.Sleep(700 * time.Millisecond)
		if err := q.TakeLease(ctx, "c", "h2", one, time.Minute); err != nil {
			t.Fatalf("after the first place's TTL: %v", err)
		}
	})
}

func TestQuotaContractConcurrentTakersNeverPassTheLeaseQuota(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{Leases: 5}
		var wg sync.WaitGroup
		var granted atomic.Int32
		for i := range 40 {
			wg.Go(func() {
				err := q.TakeLease(ctx, "a", fmt.Sprintf("h%d", i), l, time.Minute)
				if err == nil {
					granted.Add(1)
				} else if !errors.Is(err, quota.ErrExceeded) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if g := granted.Load(); g != 5 {
			t.Fatalf("%d of 40 concurrent takers got a place, want exactly 5", g)
		}
	})
}

func TestQuotaContractBytesPerDayRefuseOnceTheDaysBytesAreSpent(t *testing.T) {
	runQuotaContract(t, func(t *testing.T, q pool.QuotaKeeper) {
		ctx := context.Background()
		l := quota.Limits{BytesPerDay: 1000}
		if err := q.TakeRequest(ctx, "a", "s.example", l); err != nil {
			t.Fatal(err)
		}
		if err := q.AddBytes(ctx, "a", 600); err != nil {
			t.Fatal(err)
		}
		if err := q.TakeRequest(ctx, "a", "s.example", l); err != nil {
			t.Fatalf("600 of 1000 bytes spent: %v", err)
		}
		if err := q.AddBytes(ctx, "a", 600); err != nil {
			t.Fatal(err)
		}
		r := refusal(t, q.TakeRequest(ctx, "a", "other.example", l))
		now := time.Now().UTC()
		midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
		if r.Which != quota.WhichBytes || r.Limit != 1000 || r.RetryAfter <= 0 || r.RetryAfter > time.Until(midnight)+time.Second {
			t.Fatalf("1200 of 1000 bytes spent: %+v, want bytes-per-day until the UTC day ends (in %v)", r, time.Until(midnight))
		}
		if err := q.TakeRequest(ctx, "b", "s.example", l); err != nil {
			t.Fatalf("another client is refused by a's bytes: %v", err)
		}
	})
}
