package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestRedisStorePairSetsMirrorSel: the selection set of every attribute
// pair holds exactly the entries of sel whose members have that pair, with
// the same scores, through acquires, releases, health and latency changes,
// a member resting for every target, attribute changes and removals; and
// every key has a TTL. A selector walks its pair's set, so a drift would
// lease the wrong member or none.
func TestRedisStorePairSetsMirrorSel(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "pairs"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	members := []pool.Member{
		proxyMember(t, "a", "region", "eu", "tier", "dc"),
		proxyMember(t, "b", "region", "eu", "tier", "res"),
		proxyMember(t, "c", "region", "us", "tier", "dc"),
	}
	s.SetMembers(members)
	zset := func(k string) []string {
		v, err := r.Do("ZRANGE", k, "0", "-1", "WITHSCORES")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range v.([]any) {
			out = append(out, fmt.Sprint(x))
		}
		return out
	}
	check := func(when string, cur []pool.Member) {
		t.Helper()
		sel := zset(s.keys[0] + "sel")
		want := map[string][]string{}
		for i := 0; i+1 < len(sel); i += 2 {
			name := sel[i][42:]
			for _, m := range cur {
				if m.Name != name {
					continue
				}
				for k, v := range m.Attributes {
					pk := s.keys[0] + "sp:" + k + "\x02" + v
					want[pk] = append(want[pk], sel[i], sel[i+1])
				}
			}
		}
		keys, _ := r.Do("KEYS", "*")
		for _, k := range keys.([]any) {
			key := k.(string)
			if ttl, _ := r.Do("PTTL", key); ttl.(int64) <= 0 {
				t.Errorf("%s: key %q has no TTL (%v)", when, key, ttl)
			}
			if strings.HasPrefix(key, s.keys[0]+"sp:") {
				if got := zset(key); !slices.Equal(got, want[key]) {
					t.Errorf("%s: pair set %q = %v, want %v (sel %v)", when, key, got, want[key], sel)
				}
				delete(want, key)
			}
		}
		for k, v := range want {
			t.Errorf("%s: pair set %q missing, want %v", when, k, v)
		}
	}
	check("after the first write", members)
	ctx := context.Background()
	var held []pool.Lease
	for range 4 {
		held = append(held, cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}}))
	}
	for _, l := range held {
		if l.Member.Attributes["region"] != "eu" {
			t.Fatalf("selector region=eu leased %s", l.Member.Name)
		}
	}
	check("after selected acquires", members)
	l := cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"region": "eu", "tier": "res"}})
	if l.Member.Name != "b" {
		t.Fatalf("two-pair selector leased %s, want b", l.Member.Name)
	}
	cRelease(t, s, held[0].ID)
	check("after a release", members)
	s.SetHealth("a", false, 0)
	s.SetHealth("c", true, 3*time.Millisecond)
	check("after health and latency", members)
	cReport(t, s, held[2].ID, pool.Report{Result: rotation.ResultUpstreamFailed})
	check("after a member rests for every target", members)
	s.SetHealth("a", true, 0)
	// b moves to the us region, c leaves.
	next := []pool.Member{members[0], proxyMember(t, "b", "region", "us", "tier", "res")}
	s.SetMembers(next)
	check("after an attribute change and a removal", next)
	l = cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"region": "us"}})
	if l.Member.Name != "b" {
		t.Fatalf("region=us leased %s, want b (its new region)", l.Member.Name)
	}
	if _, err := s.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"tier": "dc", "region": "us"}}); err == nil {
		t.Fatal("a selector nobody matches any more was served")
	}
	check("at the end", next)
}
