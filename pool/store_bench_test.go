package pool_test

import (
	"fmt"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
)

// BenchmarkStoreAcquireRelease is one acquire+release cycle at each of
// storebench.Sizes, with and without a selector (goal: at least
// 200k cycles/s in process; ≤ 5 µs at 10,000 members and at most
// twice the 10-member cost).
func BenchmarkStoreAcquireRelease(b *testing.B) {
	for _, n := range storebench.Sizes {
		for _, sel := range []bool{false, true} {
			b.Run(fmt.Sprintf("members=%d/selector=%v", n, sel), func(b *testing.B) {
				storebench.AcquireRelease(b, storebench.NewStore(n), storebench.Request(sel))
			})
		}
	}
}

// BenchmarkStoreAcquireReleaseMixed is the same cycle with half of the
// acquires selecting on one of two attributes (a crawler fleet's usual mix).
func BenchmarkStoreAcquireReleaseMixed(b *testing.B) {
	for _, n := range storebench.Sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			storebench.AcquireReleaseMixed(b, storebench.NewStore(n))
		})
	}
}

// BenchmarkStoreAcquireReleaseParallel is the same cycle from GOMAXPROCS
// goroutines contending for the store.
func BenchmarkStoreAcquireReleaseParallel(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			storebench.AcquireReleaseParallel(b, storebench.NewStore(n), storebench.Request(false))
		})
	}
}

// BenchmarkStoreSetMembersChanged is one reload of a changed member list.
func BenchmarkStoreSetMembersChanged(b *testing.B) {
	for _, n := range storebench.Sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			storebench.SetMembersChanged(b, n)
		})
	}
}

// BenchmarkStoreRefusal is an acquire every member refuses (a 409), whose
// exact counts are the one linear path left in Acquire.
func BenchmarkStoreRefusal(b *testing.B) {
	for _, n := range storebench.Sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			storebench.Refusal(b, n)
		})
	}
}
