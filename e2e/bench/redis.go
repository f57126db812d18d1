package main

import (
	"fmt"
	"net/http/httptest"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool/poolapi"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// redisBench measures lease acquire+release on the Redis store: in process
// (redisstore.RedisStore over loopback, 8 goroutines) and over HTTP (poolapi.Client
// → the lease API → redisstore.RedisStore), against a redis-server of its own
// with AOF on (appendfsync everysec, the production recommendation).
// The goal over HTTP is ≥ 10k/s, as with the memory store.
func redisBench() ([]row, error) {
	r, err := testutil.LaunchRedis(testutil.RedisOptions{AppendFsync: "everysec"})
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
	srv := httptest.NewServer(poolapi.NewAPIServer(store, poolapi.APIOptions{Token: "bench-token"}))
	defer srv.Close()
	client, err := poolapi.NewClient(srv.URL, "bench-token", nil)
	if err != nil {
		return nil, err
	}
	overHTTP, err := acquireReleaseRate(client, 4)
	if err != nil {
		return nil, fmt.Errorf("redis bench over HTTP: %w", err)
	}
	return []row{
		{metric: "lease acquire+release in process, Redis store (loopback)", chain: f0(inProc) + "/s", ok: true},
		// Counted in cycles like the memory store's row (a cycle is two
		// lease operations), against the same target.
		{metric: "lease acquire+release over HTTP, Redis store", chain: f0(overHTTP) + "/s", target: "≥ 10k/s", ok: overHTTP >= 10e3},
	}, nil
}
