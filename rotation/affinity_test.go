package rotation

import (
	"fmt"
	"sync"
	"testing"
	"time"
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
	// Many sets back to back: each must be readable immediately, which is
	// what the Wait after Set guarantees despite ristretto's async writes.
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
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, ok := a.Get("s", "t"); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("pin still returned long after its ttl")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
