//go:build !sidecar

package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// checkRedisURL validates a Redis --lease-store URL (its errors mask the
// password).
func checkRedisURL(raw string) error {
	_, err := redisstore.ParseRedisURL(raw)
	return err
}

// openRedisStore makes the shared Redis lease store of l.
func openRedisStore(l leaseStoreConfig, o pool.StoreOptions, log *slog.Logger) (pool.LeaseStore, func(), error) {
	s, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: l.url, Password: l.password, Prefix: l.prefix, Store: o, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--%s: %w", flagLeaseStore, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		// Not fatal: the lease API answers 503 store_unavailable until the
		// store answers, and recovers by itself.
		log.Error("lease store unreachable at start; serving 503 store_unavailable until it answers", "error", err)
	} else {
		log.Info("lease store on Redis", "prefix", l.prefix)
	}
	return s, func() { _ = s.Close() }, nil
}
