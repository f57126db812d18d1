//go:build sidecar

package leasestore

import (
	"errors"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// errNoRedisInSidecar refuses a Redis lease store in the sidecar build
// (make sidecar, -tags sidecar). A sidecar gateway leases from the
// controller's API (--lease-api) or holds a pool of its own in memory;
// leaving the Redis store out keeps the Redis client and its package
// initialisation out of every crawler pod's memory.
var errNoRedisInSidecar = errors.New("this build (proxyfleet-sidecar) has no Redis lease store: use memory, --lease-api, or the full proxyfleet binary")

// CheckURL refuses every Redis URL: see errNoRedisInSidecar.
func CheckURL(string) error { return errNoRedisInSidecar }

// openRedis is never reached (CheckURL refused the URL first).
func openRedis(Config, pool.StoreOptions, *slog.Logger, func(string, time.Duration, error)) (pool.LeaseStore, func(), error) {
	return nil, nil, errNoRedisInSidecar
}
