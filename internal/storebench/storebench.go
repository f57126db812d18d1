// Package storebench is the lease store's benchmark workload, shared by the
// Go benchmarks in pool and by `make bench` (e2e/bench), so both measure the
// same thing: acquire+release cycles through pool.Store's public API.
//
// It imports pool and rotation only; never a launcher or the Redis store (its
// callers pass the store).
package storebench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Sizes are the pool sizes the benchmarks report: a small fleet, hundreds of
// VMs, and an upstream list of thousands of commercial exits.
var Sizes = []int{10, 1000, 10000}

// Selector is the attribute selector of the "with selector" figures: it
// matches a quarter of the members (see Members).
var Selector = map[string]string{"region": "eu"}

// Members returns n members named m00000…, with attributes region (eu, us,
// ap, sa in turn) and tier (dc, res), and known latencies of 1–50 ms, so that
// selection sees realistic attribute sets and latency tie-breaks.
func Members(n int) []pool.MemberHealth {
	regions := []string{"eu", "us", "ap", "sa"}
	tiers := []string{"dc", "res"}
	out := make([]pool.MemberHealth, n)
	for i := range out {
		out[i] = pool.MemberHealth{
			Member: pool.Member{
				Name:       fmt.Sprintf("m%05d", i),
				URL:        &url.URL{Scheme: "http", Host: fmt.Sprintf("10.%d.%d.%d:3128", i>>16&255, i>>8&255, i&255)},
				Attributes: map[string]string{"region": regions[i%4], "tier": tiers[i/4%2]},
			},
			Healthy: true,
			Latency: time.Duration(1+i%50) * time.Millisecond,
		}
	}
	return out
}

// NewStore is a store with the default options holding Members(n).
func NewStore(n int) *pool.Store {
	s := pool.NewStore(pool.StoreOptions{})
	s.SetMembersHealth(Members(n))
	return s
}

// Request is the acquire of one cycle, with or without Selector.
func Request(withSelector bool) pool.AcquireRequest {
	req := pool.AcquireRequest{Target: "example.com"}
	if withSelector {
		req.Selector = Selector
	}
	return req
}

// Cycle is one acquire+release.
func Cycle(ctx context.Context, s pool.Pool, req pool.AcquireRequest) error {
	l, err := s.Acquire(ctx, req)
	if err != nil {
		return err
	}
	return s.Release(ctx, l.ID)
}

// LaterCycle is the gateway's acquire+release: the release deferred as the
// gateway defers a finished request's (pool.LaterReleaser: it goes with the
// next acquire). FlushLater sends the last one.
func LaterCycle(ctx context.Context, s pool.Pool, lr pool.LaterReleaser, req pool.AcquireRequest) error {
	l, err := s.Acquire(ctx, req)
	if err != nil {
		return err
	}
	lr.ReleaseLater(l.ID)
	return nil
}

// FlushLater sends the release LaterCycle deferred last: a release of a
// lease nobody holds carries it.
func FlushLater(ctx context.Context, s pool.Pool) error {
	return s.Release(ctx, "storebench-flush")
}

// AcquireRelease runs acquire+release cycles on s from one goroutine.
func AcquireRelease(b *testing.B, s *pool.Store, req pool.AcquireRequest) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := Cycle(ctx, s, req); err != nil {
			b.Fatal(err)
		}
	}
}

// AcquireReleaseMixed is the mixed workload: half of the acquires
// with an attribute selector, alternating between Selector and tier=dc, so
// that every member sits in the heaps of both of its attribute pairs as well
// as the heap of all members.
func AcquireReleaseMixed(b *testing.B, s *pool.Store) {
	ctx := context.Background()
	reqs := MixedRequests()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := Cycle(ctx, s, reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// AcquireReleaseParallel runs the same cycles from GOMAXPROCS goroutines
// contending for the store.
func AcquireReleaseParallel(b *testing.B, s *pool.Store, req pool.AcquireRequest) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := Cycle(ctx, s, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// SetMembersChanged measures SetMembersHealth with a changed list of n
// members, as a reload or the controller's Proxy cache does it: each
// iteration alternates between two lists that differ in one removed member,
// one added member and one member whose attributes changed, while a few
// leases stay held.
func SetMembersChanged(b *testing.B, n int) {
	s := NewStore(n)
	ctx := context.Background()
	for range 16 {
		if _, err := s.Acquire(ctx, Request(false)); err != nil {
			b.Fatal(err)
		}
	}
	a := Members(n)
	c := Members(n + 1)
	c = append(c[1:n], c[n]) // first member removed, one added
	c[n/2].Attributes = map[string]string{"region": "eu", "tier": "gpu"}
	lists := [][]pool.MemberHealth{a, c}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.SetMembersHealth(lists[i%2])
		i++
	}
}

// Refusal measures an acquire that every member refuses: all n members are
// cooling down for the target, so the store walks its index and then counts
// why (the 409 path, linear by design).
func Refusal(b *testing.B, n int) {
	s := NewStore(n)
	ctx := context.Background()
	req := Request(false)
	for range n {
		l, err := s.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Report(ctx, l.ID, pool.Report{Result: rotation.ResultBanned}); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, l.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		var nm *pool.NoMatchError
		if _, err := s.Acquire(ctx, req); !errors.As(err, &nm) || nm.InCooldown != n {
			b.Fatalf("Acquire: %v, want every member in cooldown", err)
		}
	}
}
