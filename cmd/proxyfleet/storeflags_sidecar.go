//go:build sidecar

package main

import (
	"errors"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// errNoRedisInSidecar refuses a Redis --lease-store in the sidecar build
// (make sidecar, -tags sidecar). A sidecar gateway leases from the
// controller's API (--pool-api) or holds a pool of its own in memory;
// leaving the Redis store out keeps the Redis client and its package
// initialisation out of every crawler pod's memory.
var errNoRedisInSidecar = errors.New("this build (proxyfleet-sidecar) has no Redis lease store: use memory, --pool-api, or the full proxyfleet binary")

// checkRedisURL refuses every Redis URL: see errNoRedisInSidecar.
func checkRedisURL(string) error { return errNoRedisInSidecar }

// openRedisStore is never reached (checkRedisURL refused the flag first).
func openRedisStore(leaseStoreConfig, pool.StoreOptions, *slog.Logger, func(string, time.Duration, error)) (pool.LeaseStore, func(), error) {
	return nil, nil, errNoRedisInSidecar
}
