package mitmca

import (
	"crypto/tls"
	"testing"
	"time"
)

func TestLeafCacheKeepsWithinItsSizeAndTime(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	leaf := func() *tls.Certificate { return &tls.Certificate{} }
	type op struct {
		set  string // host to set (cost 10, ends t0+1h), or "" to get
		get  string
		at   time.Duration
		want bool
	}
	tests := []struct {
		name string
		max  int64
		ops  []op
		size int
	}{
		{"a leaf set is found", 100, []op{{set: "a"}, {get: "a", want: true}}, 1},
		{"an absent host is a miss", 100, []op{{set: "a"}, {get: "b"}}, 1},
		{"a leaf past its end is a miss and dropped", 100, []op{{set: "a"}, {get: "a", at: time.Hour}}, 0},
		{"over the size the least recently used goes first", 30, []op{
			{set: "a"}, {set: "b"}, {set: "c"}, {get: "a", want: true}, {set: "d"},
			{get: "b"}, {get: "a", want: true}, {get: "c", want: true}, {get: "d", want: true}}, 3},
		{"setting a host again replaces its leaf, not adds", 20, []op{{set: "a"}, {set: "a"}, {set: "b"}, {get: "a", want: true}}, 2},
		{"a leaf larger than the cache is not kept", 5, []op{{set: "a"}, {get: "a"}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newLeafCache(tc.max)
			for i, o := range tc.ops {
				if o.set != "" {
					c.set(o.set, leaf(), 10, t0.Add(time.Hour))
					continue
				}
				if _, ok := c.get(o.get, t0.Add(o.at)); ok != o.want {
					t.Fatalf("op %d: get(%q) at +%v found %v, want %v", i, o.get, o.at, ok, o.want)
				}
			}
			if n := c.len(); n != tc.size {
				t.Fatalf("%d leaves held, want %d", n, tc.size)
			}
			if c.size > tc.max {
				t.Fatalf("held %d bytes over the bound %d", c.size, tc.max)
			}
		})
	}
}

// TestLeafForMintsAgainOnceTheCachedLeafEnds: a leaf is served from the
// cache for half its remaining life (the test CA's hour caps it), then a
// new one is minted.
func TestLeafForMintsAgainOnceTheCachedLeafEnds(t *testing.T) {
	ca, _ := newTestCA(t)
	now := time.Now()
	ca.now = func() time.Time { return now }
	first, err := ca.LeafFor("shop.example")
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(20 * time.Minute)
	if again, _ := ca.LeafFor("shop.example"); again != first || ca.Minted() != 1 {
		t.Fatalf("20 minutes on: minted %d, the same leaf %v; want the cached one", ca.Minted(), again == first)
	}
	now = now.Add(15 * time.Minute)
	if later, _ := ca.LeafFor("shop.example"); later == first || ca.Minted() != 2 {
		t.Fatalf("35 minutes on (past half the leaf's life): minted %d, the same leaf %v; want a new one", ca.Minted(), later == first)
	}
}

// len is the number of leaves c holds.
func (c *leafCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
