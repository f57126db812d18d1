package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// redisBench measures lease acquire+release on the Redis store: in process
// (redisstore.RedisStore over loopback, 8 goroutines) and over HTTP (leaseapi.Client
// → the lease API → redisstore.RedisStore), against a redis-server of its own
// with AOF on (appendfsync everysec, the production recommendation).
// The goal over HTTP is ≥ 10k/s, as with the memory store.
func redisBench() ([]row, error) {
	r, err := redis.Launch(redis.Options{AppendFsync: "everysec"})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	store, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: r.URL(), Prefix: "bench"})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	store.SetMembers(benchMembers())
	if len(store.Members()) != len(benchMembers()) {
		return nil, fmt.Errorf("redis bench: members not written")
	}

	inProc, err := acquireReleaseRate(store, 4)
	if err != nil {
		return nil, fmt.Errorf("redis bench in process: %w", err)
	}
	srv := httptest.NewServer(leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: "bench-token"}))
	defer srv.Close()
	client, err := leaseapi.NewClient(srv.URL, "bench-token", nil)
	if err != nil {
		return nil, err
	}
	overHTTP, err := acquireReleaseRate(client, 4)
	if err != nil {
		return nil, fmt.Errorf("redis bench over HTTP: %w", err)
	}
	rows := []row{
		{metric: "lease acquire+release in process, Redis store (loopback)", chain: f0(inProc) + "/s", ok: true},
		// Counted in cycles like the memory store's row (a cycle is two
		// lease operations), against the same target.
		{metric: "lease acquire+release over HTTP, Redis store", chain: f0(overHTTP) + "/s", target: "≥ 10k/s", ok: overHTTP >= 10e3},
	}
	cycle, err := redisCycleRows(r)
	if err != nil {
		return nil, err
	}
	share, err := redisShareRow()
	if err != nil {
		return nil, err
	}
	return append(append(rows, cycle...), share), nil
}

// redisCycleRows is one caller's acquire+release cycle on the Redis store
// at 10,000 members (storebench's mixed workload, the redis-server above):
// as the client sees it, and the server's own CPU per cycle.
func redisCycleRows(r *redis.Server) ([]row, error) {
	const n = 10000
	store, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: r.URL(), Prefix: "bench-cycle"})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	store.SetMembersHealth(storebench.Members(n))
	res := testing.Benchmark(func(b *testing.B) { storebench.RedisCycles(b, store, r) })
	if res.N == 0 {
		return nil, fmt.Errorf("redis cycle benchmark failed")
	}
	client := float64(res.NsPerOp()) / 1e3
	cpu := res.Extra["redis-µs/cycle"]
	return []row{
		{metric: "Redis acquire+release at 10,000 members, client-seen", chain: fmt.Sprintf("%.0f µs", client), target: "≤ 120 µs", ok: client <= 120},
		{metric: "  redis-server CPU per cycle", chain: fmt.Sprintf("%.0f µs (scripts %.0f µs)", cpu, res.Extra["script-µs/cycle"]), target: "≤ 40 µs", ok: cpu <= 40},
	}, nil
}

// redisShareRow is one fleet's acquire+release cycles (1,000 members) on a
// Redis Cluster of three primaries and three replicas with three member
// groups (--lease-store-shards 3): the largest share of the fleet's
// commands any primary ran.
func redisShareRow() (row, error) {
	rc, err := redis.LaunchCluster(redis.ClusterTopology{})
	if err != nil {
		return row{}, err
	}
	defer rc.Close()
	store, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: rc.URL(), Prefix: "bench-share", Shards: 3})
	if err != nil {
		return row{}, err
	}
	defer store.Close()
	store.SetMembersHealth(storebench.Members(1000))
	primaries := storebench.Primaries(rc.Nodes)
	shares, err := storebench.CommandShares(primaries, func() error {
		return storebench.MixedCycles(context.Background(), store, 3000)
	})
	if err != nil {
		return row{}, err
	}
	share := 0.0
	for _, sh := range shares {
		share = max(share, sh)
	}
	return row{metric: fmt.Sprintf("one fleet's largest shard share, Cluster of %d primaries, 3 groups", len(primaries)), chain: fmt.Sprintf("%.0f %%", share), target: "≤ 45 %", ok: len(primaries) == 3 && share <= 45}, nil
}
