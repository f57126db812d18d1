//go:build !sidecar

package leasestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// CheckURL validates a Redis lease store URL (its errors mask the
// password).
func CheckURL(raw string) error {
	_, err := redisstore.ParseRedisURL(raw)
	return err
}

// openRedis makes the shared Redis lease store of c and asks it once. A
// store that does not answer yet is logged, naming the setting, and served
// as 503 store_unavailable until it answers (Redis may start after us). A
// TLS handshake that fails is fatal instead: a wrong CA or a refused client
// certificate never heals by itself, and it names the setting to fix.
func openRedis(c Config, o pool.StoreOptions, log *slog.Logger, observe func(string, time.Duration, error)) (pool.LeaseStore, func(), error) {
	n := c.Names
	s, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: c.URL, Password: c.Password, Prefix: c.Prefix, Store: o, Logger: log,
		CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, Observe: observe, Shards: c.Shards})
	if err != nil {
		var fe *redisstore.TLSFileError
		if errors.As(err, &fe) {
			name := or(n.CAFile, "CAFile")
			if fe.Field == "CertFile" {
				name = or(n.CertFile, "CertFile") + "/" + or(n.KeyFile, "KeyFile")
			}
			return nil, nil, fmt.Errorf("%s %w", name, err)
		}
		return nil, nil, fmt.Errorf("%s: %w", or(n.URL, "URL"), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Ping(ctx)
	switch {
	case errors.Is(err, redisstore.ErrTLSClientCert):
		_ = s.Close()
		return nil, nil, fmt.Errorf("%s %s: %w", or(n.CertFile, "CertFile"), orNone(c.CertFile, "(none)"), err)
	case errors.Is(err, redisstore.ErrTLS):
		_ = s.Close()
		return nil, nil, fmt.Errorf("%s %s (for %s %s): %w", or(n.CAFile, "CAFile"), orNone(c.CAFile, "(none: the system roots)"),
			or(n.URL, "URL"), redact.URL(c.URL), err)
	case err != nil:
		// Not fatal: the lease API answers 503 store_unavailable until the
		// store answers, and recovers by itself.
		log.Error("lease store unreachable at start; serving 503 store_unavailable until it answers",
			"flag", or(n.URL, "URL"), "url", redact.URL(c.URL), "error", err)
	default:
		log.Info("lease store on Redis", "url", redact.URL(c.URL), "prefix", c.Prefix)
	}
	return s, func() { _ = s.Close() }, nil
}

// orNone is a file setting's value as an error shows it.
func orNone(path, none string) string {
	if path == "" {
		return none
	}
	return path
}
