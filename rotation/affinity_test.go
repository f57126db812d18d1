package rotation

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

func newTestAffinity(t *testing.T, n int64) *Affinity {
	t.Helper()
	a, err := NewAffinity(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

func TestNewAffinityRejectsNonPositiveSize(t *testing.T) {
	for _, n := range []int64{0, -1} {
		if _, err := NewAffinity(n); err == nil {
			t.Errorf("NewAffinity(%d) succeeded, want an error", n)
		}
	}
}

func TestAffinitySetIsVisibleToTheNextGet(t *testing.T) {
	a := newTestAffinity(t, 1000)
	exp := time.Now().Add(time.Minute)
	// Many sets back to back: each must be readable immediately.
	for i := range 500 {
		s := fmt.Sprintf("s%d", i)
		a.Set(s, "example.com", Pin{LeaseID: "L" + s, Member: "m1", ExpiresAt: exp}, time.Minute)
		got, ok := a.Get(s, "example.com")
		if !ok || got.LeaseID != "L"+s || got.Member != "m1" || !got.ExpiresAt.Equal(exp) {
			t.Fatalf("Get after Set #%d = (%+v, %v)", i, got, ok)
		}
	}
}

func TestAffinityKeysAreSessionAndTarget(t *testing.T) {
	a := newTestAffinity(t, 100)
	exp := time.Now().Add(time.Minute)
	a.Set("s1", "a.com", Pin{LeaseID: "1", ExpiresAt: exp}, time.Minute)
	a.Set("s1", "b.com", Pin{LeaseID: "2", ExpiresAt: exp}, time.Minute)
	a.Set("s2", "a.com", Pin{LeaseID: "3", ExpiresAt: exp}, time.Minute)
	for _, tc := range []struct{ s, t, want string }{{"s1", "a.com", "1"}, {"s1", "b.com", "2"}, {"s2", "a.com", "3"}} {
		if p, ok := a.Get(tc.s, tc.t); !ok || p.LeaseID != tc.want {
			t.Errorf("Get(%s, %s) = (%+v, %v), want lease %s", tc.s, tc.t, p, ok, tc.want)
		}
	}
	if _, ok := a.Get("s2", "b.com"); ok {
		t.Error("Get(s2, b.com) found a pin that was never set")
	}
	// A separator in the parts must not make two pairs collide.
	if _, ok := a.Get("s1\x00a", ".com"); ok {
		t.Error("a crafted session collided with another pair")
	}
}

func TestAffinityUpdateReplacesThePin(t *testing.T) {
	a := newTestAffinity(t, 100)
	exp := time.Now().Add(time.Minute)
	a.Set("s", "t", Pin{LeaseID: "old", ExpiresAt: exp}, time.Minute)
	a.Set("s", "t", Pin{LeaseID: "new", ExpiresAt: exp}, time.Minute)
	if p, ok := a.Get("s", "t"); !ok || p.LeaseID != "new" {
		t.Errorf("Get = (%+v, %v), want the new pin", p, ok)
	}
}

func TestAffinityDelete(t *testing.T) {
	a := newTestAffinity(t, 100)
	a.Set("s", "t", Pin{LeaseID: "1", ExpiresAt: time.Now().Add(time.Minute)}, time.Minute)
	a.Delete("s", "t")
	if p, ok := a.Get("s", "t"); ok {
		t.Errorf("Get after Delete = %+v, want nothing", p)
	}
}

func TestAffinityNeverReturnsAnExpiredPin(t *testing.T) {
	a := newTestAffinity(t, 100)
	// The cache TTL is long but the lease is over: the pin must not be used.
	a.Set("s", "t", Pin{LeaseID: "1", ExpiresAt: time.Now().Add(-time.Second)}, time.Hour)
	if p, ok := a.Get("s", "t"); ok {
		t.Errorf("Get returned an expired pin %+v", p)
	}
	// Zero or negative TTL stores nothing and drops what was there.
	a.Set("s", "u", Pin{LeaseID: "2", ExpiresAt: time.Now().Add(time.Hour)}, time.Hour)
	a.Set("s", "u", Pin{LeaseID: "3", ExpiresAt: time.Now().Add(time.Hour)}, 0)
	if p, ok := a.Get("s", "u"); ok {
		t.Errorf("Get after Set with ttl 0 = %+v, want nothing", p)
	}
}

func TestAffinityEntryTTLExpires(t *testing.T) {
	a := newTestAffinity(t, 100)
	a.Set("s", "t", Pin{LeaseID: "1"}, 50*time.Millisecond)
	if _, ok := a.Get("s", "t"); !ok {
		t.Fatal("pin not visible right after Set")
	}
	poll.Until(t, 20*time.Second, "the pin to expire with its ttl", func() error {
		_, ok := a.Get("s", "t")
		return poll.Check(!ok, "pin still returned")
	})
}

func TestAffinityConcurrentUse(t *testing.T) {
	a := newTestAffinity(t, 10000)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				s := fmt.Sprintf("g%d-%d", g, i%20)
				a.Set(s, "t", Pin{LeaseID: s, ExpiresAt: time.Now().Add(time.Minute)}, time.Minute)
				if p, ok := a.Get(s, "t"); ok && p.LeaseID != s {
					t.Errorf("Get(%s) = %+v, a pin of another session", s, p)
				}
				if i%7 == 0 {
					a.Delete(s, "t")
				}
			}
		})
	}
	wg.Wait()
}

func TestAffinityRefusesANewPinWhenFullAndNeverEvictsALiveOne(t *testing.T) {
	a := newTestAffinity(t, 3)
	exp := time.Now().Add(time.Hour)
	for _, s := range []string{"a", "b", "c"} {
		if err := a.Set(s, "t", Pin{LeaseID: s, ExpiresAt: exp}, time.Hour); err != nil {
			t.Fatalf("Set(%s): %v", s, err)
		}
	}
	if err := a.Set("d", "t", Pin{LeaseID: "d", ExpiresAt: exp}, time.Hour); !errors.Is(err, ErrAffinityFull) {
		t.Fatalf("a fourth pin: %v, want ErrAffinityFull", err)
	}
	// Replacing a pin takes no new place; a Lost mark is always kept.
	if err := a.Set("a", "t", Pin{LeaseID: "a2", ExpiresAt: exp}, time.Hour); err != nil {
		t.Fatalf("replacing a pin of a full table: %v", err)
	}
	if err := a.Set("e", "t", Pin{Member: "m", Lost: true}, time.Hour); err != nil {
		t.Fatalf("a Lost mark in a full table: %v", err)
	}
	for s, want := range map[string]string{"a": "a2", "b": "b", "c": "c"} {
		if p, ok := a.Get(s, "t"); !ok || p.LeaseID != want {
			t.Fatalf("Get(%s) = %+v, %v; want lease %s (a live pin is never evicted)", s, p, ok, want)
		}
	}
	if p, ok := a.Get("e", "t"); !ok || !p.Lost {
		t.Fatalf("the Lost mark: %+v, %v", p, ok)
	}
	if _, ok := a.Get("d", "t"); ok {
		t.Fatal("the refused pin is there")
	}
}

func TestAffinityFullSweepsExpiredPinsBeforeRefusing(t *testing.T) {
	a := newTestAffinity(t, 2)
	now := time.Now()
	a.now = func() time.Time { return now }
	a.Set("a", "t", Pin{LeaseID: "a"}, time.Second)
	a.Set("b", "t", Pin{LeaseID: "b"}, time.Hour)
	now = now.Add(2 * time.Second) // a's pin is over; the table still holds it
	if err := a.Set("c", "t", Pin{LeaseID: "c"}, time.Hour); err != nil {
		t.Fatalf("a new pin when one held pin is expired: %v", err)
	}
	if a.Len() != 2 {
		t.Fatalf("Len = %d, want 2 (b and c)", a.Len())
	}
	// A second full Set within the second does not sweep again.
	if err := a.Set("d", "t", Pin{LeaseID: "d"}, time.Hour); !errors.Is(err, ErrAffinityFull) {
		t.Fatalf("a pin beyond the maximum: %v", err)
	}
}

// TestAffinityGivesMemoryBackAfterABurst: 30,000 pins end, the sweep drops
// them and rebuilds the shards' maps, and the heap falls back to where it
// was before the burst (Go maps keep their size when emptied).
func TestAffinityGivesMemoryBackAfterABurst(t *testing.T) {
	a, err := newAffinity(100_000, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	now := time.Now()
	a.now = func() time.Time { return now }
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	for i := range 30_000 {
		if err := a.Set(fmt.Sprintf("session-%d", i), "example.com", Pin{LeaseID: fmt.Sprintf("lease-%d", i), Member: "m1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	during := heap()
	now = now.Add(2 * time.Minute)
	a.sweep(now)
	after := heap()
	if a.Len() != 0 {
		t.Fatalf("Len after the sweep = %d", a.Len())
	}
	perPin := float64(during-before) / 30_000
	t.Logf("heap: before %d, with 30,000 pins %d (%.0f B each, keys and lease IDs included), after the sweep %d", before, during, perPin, after)
	if after-before > (during-before)/10 {
		t.Fatalf("after the sweep the heap is %d bytes above where it started, of the burst's %d: the maps kept their size", after-before, during-before)
	}
}

func TestAffinityDrainHandsBackTheLiveLeasesAndEmptiesTheTable(t *testing.T) {
	a := newTestAffinity(t, 10)
	now := time.Unix(1_700_000_000, 0)
	a.now = func() time.Time { return now }
	a.Set("s1", "a.example", Pin{LeaseID: "L1", Member: "m1"}, time.Minute)
	a.Set("s2", "a.example", Pin{LeaseID: "L2", Member: "m2"}, time.Minute)
	a.Set("s3", "a.example", Pin{LeaseID: "L3", Member: "m1"}, time.Second)
	a.Set("strict", "a.example", Pin{Member: "m2", Lost: true}, time.Minute)
	now = now.Add(2 * time.Second) // L3's pin has ended: its lease is the pool's to expire

	got := map[string]string{}
	for _, p := range a.Drain() {
		got[p.LeaseID] = p.Member
	}
	if want := map[string]string{"L1": "m1", "L2": "m2"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Drain gave %v, want the live pins with a lease %v", got, want)
	}
	if n := a.Len(); n != 0 {
		t.Fatalf("after Drain the table holds %d pins, want none", n)
	}
	if _, ok := a.Get("s1", "a.example"); ok {
		t.Fatal("a drained pin is still returned")
	}
	if again := a.Drain(); len(again) != 0 {
		t.Fatalf("a second Drain gave %v, want nothing", again)
	}
}
