package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
)

func TestShardTagsLandOnEvenSlotRanges(t *testing.T) {
	// CRC-16/XMODEM as Redis computes it (CLUSTER KEYSLOT "123456789" is 12739).
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16 = %#x, want 0x31c3", got)
	}
	for _, n := range []int{2, 3, 6} {
		for i := range n {
			tag := shardTag("proxyfleet", i, n)
			slot := int(crc16(tag) % 16384)
			if lo, hi := i*16384/n, (i+1)*16384/n; slot < lo || slot >= hi {
				t.Errorf("shard %d of %d: tag %q in slot %d, outside [%d, %d)", i, n, tag, slot, lo, hi)
			}
		}
	}
}

// TestStoreShardsTakeGroupsInTurn: with three groups on a real Cluster,
// acquires take the groups in turn, each group's members by rotation.Less
// (least recently chosen first), every member only ever in its own group,
// and a pinned member, a release and a report find their group.
func TestStoreShardsTakeGroupsInTurn(t *testing.T) {
	_, rc := topologies(t)
	s, err := NewRedisStore(RedisOptions{URL: rc.URL(), Prefix: fmt.Sprintf("shards%d", contractPrefixes.Add(1)), Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ms []pool.Member
	for i := range 9 {
		ms = append(ms, proxyMember(t, "m"+strconv.Itoa(i)))
	}
	s.SetMembers(ms)
	if got := len(s.Members()); got != 9 {
		t.Fatalf("%d members listed across the groups, want 9", got)
	}
	ctx := context.Background()
	perGroup := map[int][]string{}
	for range 30 {
		l := cAcquire(t, s, pool.AcquireRequest{Target: "a.example"})
		g := s.shardOf(l.Member.Name)
		if lg := s.leaseShard(l.ID); lg != g {
			t.Fatalf("lease %s names group %d, its member %s is in %d", l.ID, lg, l.Member.Name, g)
		}
		perGroup[g] = append(perGroup[g], l.Member.Name)
		cRelease(t, s, l.ID)
	}
	for g, chosen := range perGroup {
		if len(chosen) != 10 {
			t.Errorf("group %d chosen %d times of 30, want 10 (in turn)", g, len(chosen))
		}
		// Least recently chosen first: the group's members cycle.
		k := 0
		for _, m := range ms {
			if s.shardOf(m.Name) == g {
				k++
			}
		}
		for i := k; i < len(chosen); i++ {
			if chosen[i] != chosen[i-k] {
				t.Errorf("group %d order %v: not a cycle of its %d members", g, chosen, k)
				break
			}
		}
	}
	// A pin finds its member's group; a ban reported on it cools it there.
	l := cAcquire(t, s, pool.AcquireRequest{Proxy: "m4", Target: "b.example"})
	cReport(t, s, l.ID, pool.Report{Result: "banned"})
	if _, err := s.Acquire(ctx, pool.AcquireRequest{Proxy: "m4", Target: "b.example"}); err == nil {
		t.Fatal("the banned member was leased again for its site")
	}
	if cooldownLeft(t, s, "m4", "b.example") <= 0 {
		t.Fatal("the ban did not cool its member down")
	}
	// A refusal counts every group's members.
	if nm := noMatch(t, func() error {
		_, err := s.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"x": "y"}})
		return err
	}()); nm.Considered != 0 {
		t.Fatalf("refusal %+v for a selector nobody matches", nm)
	}
	s.SetHealth("m1", false, 0)
	for _, m := range ms {
		if m.Name != "m1" {
			s.SetHealth(m.Name, false, 0)
		}
	}
	_, err = s.Acquire(ctx, pool.AcquireRequest{})
	if nm := noMatch(t, err); nm.Considered != 9 || nm.Unhealthy != 9 {
		t.Fatalf("refusal %+v, want all 9 members of the 3 groups counted unhealthy", nm)
	}
	if !strings.HasPrefix(s.shards[1][0], "{"+s.prefix+":s1:") {
		t.Fatalf("group 1's keys %v", s.shards[1])
	}
}

// BenchmarkRedisStoreClusterShare is one fleet's acquire+release cycles
// (storebench's mixed workload, 1,000 members) on a real Cluster of three
// primaries and three replicas, unsharded and with three groups; it
// reports each primary's share of the commands it executed (INFO
// commandstats, calls) as shard-max-%, and the cycle as the client sees it.
//
//	go test -run x -bench BenchmarkRedisStoreClusterShare -benchtime 3000x ./pool/redisstore/
func BenchmarkRedisStoreClusterShare(b *testing.B) {
	rc := redis.StartCluster(b, redis.ClusterTopology{})
	primaries := storebench.Primaries(rc.Nodes)
	if len(primaries) != 3 {
		b.Fatalf("%d primaries, want 3", len(primaries))
	}
	for _, shards := range []int{1, 3} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			s, err := NewRedisStore(RedisOptions{URL: rc.URL(), Prefix: fmt.Sprintf("share%d", shards), Shards: shards})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.SetMembersHealth(storebench.Members(1000))
			ctx := context.Background()
			reqs := storebench.MixedRequests()
			shares, err := storebench.CommandShares(primaries, func() error {
				for i := 0; b.Loop(); i++ {
					if err := storebench.Cycle(ctx, s, reqs[i%len(reqs)]); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			most := 0.0
			for j, sh := range shares {
				b.ReportMetric(sh, fmt.Sprintf("shard%d-%%", j))
				most = max(most, sh)
			}
			b.ReportMetric(most, "shard-max-%")
		})
	}
}
