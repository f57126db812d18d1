// Package leasestore opens the lease store a gateway or a controller is
// configured with: the in-process memory store (pool.NewStore), or a shared
// Redis one (pool/redisstore) asked once at start, so that a TLS setup that
// can never work stops the start and a store that is merely down does not.
//
// It owns the store's settings and their checks; it holds no flags and must
// not import cmd, gateway or controller packages. The sidecar build (-tags
// sidecar) leaves pool/redisstore and its Redis client out: there every
// Redis URL is refused.
package leasestore

import (
	"log/slog"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
)

// Config is a parsed lease store setting. URL "" is the in-memory store;
// otherwise it is a Redis URL CheckURL accepted.
type Config struct {
	URL      string
	Password string
	// Prefix starts every Redis key (several fleets, one Redis).
	Prefix string
	// CAFile, CertFile and KeyFile are the TLS files (rediss:// only).
	CAFile, CertFile, KeyFile string
	// Shards is how many groups, each under a hash tag of its own, the
	// Redis store splits the members into.
	Shards int
	// Names are how the operator set the fields, for the errors and logs
	// that point at the one to fix.
	Names Names
}

// Names are how the operator knows the settings an error or a log line
// points at (a command's flags, such as --lease-store); an empty one reads
// as the Config field's name.
type Names struct {
	URL, CAFile, CertFile, KeyFile string
}

// or is name, or field when name is empty.
func or(name, field string) string {
	if name == "" {
		return field
	}
	return name
}

// Open makes the configured store; close releases its connections. A
// Redis store's round trips are timed in reg
// (proxyfleet_lease_store_call_duration_seconds).
func (c Config) Open(o pool.StoreOptions, log *slog.Logger, reg prometheus.Registerer) (store pool.LeaseStore, closeStore func(), err error) {
	if c.URL == "" {
		return pool.NewStore(o), func() {}, nil
	}
	return openRedis(c, o, log, metrics.NewLeaseStoreCalls(reg).Observe)
}
