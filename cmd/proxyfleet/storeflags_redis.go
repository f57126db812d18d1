//go:build !sidecar

package main

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

// checkRedisURL validates a Redis --lease-store URL (its errors mask the
// password).
func checkRedisURL(raw string) error {
	_, err := redisstore.ParseRedisURL(raw)
	return err
}

// openRedisStore makes the shared Redis lease store of l and asks it once.
// A store that does not answer yet is logged, naming the flag, and served
// as 503 store_unavailable until it answers (Redis may start after us). A
// TLS handshake that fails is fatal instead: a wrong CA or a refused client
// certificate never heals by itself, and it names the flag to fix.
func openRedisStore(l leaseStoreConfig, o pool.StoreOptions, log *slog.Logger, observe func(string, time.Duration, error)) (pool.LeaseStore, func(), error) {
	s, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: l.url, Password: l.password, Prefix: l.prefix, Store: o, Logger: log,
		CAFile: l.caFile, CertFile: l.certFile, KeyFile: l.keyFile, Observe: observe, Shards: l.shards})
	if err != nil {
		var fe *redisstore.TLSFileError
		if errors.As(err, &fe) {
			name := flagLeaseStoreCAFile
			if fe.Field == "CertFile" {
				name = flagLeaseStoreCertFile + "/--" + flagLeaseStoreKeyFile
			}
			return nil, nil, fmt.Errorf("--%s %w", name, err)
		}
		return nil, nil, fmt.Errorf("--%s: %w", flagLeaseStore, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Ping(ctx)
	switch {
	case errors.Is(err, redisstore.ErrTLSClientCert):
		_ = s.Close()
		return nil, nil, fmt.Errorf("--%s %s: %w", flagLeaseStoreCertFile, orNone(l.certFile, "(none)"), err)
	case errors.Is(err, redisstore.ErrTLS):
		_ = s.Close()
		return nil, nil, fmt.Errorf("--%s %s (for --%s %s): %w", flagLeaseStoreCAFile, orNone(l.caFile, "(none: the system roots)"), flagLeaseStore, redact.URL(l.url), err)
	case err != nil:
		// Not fatal: the lease API answers 503 store_unavailable until the
		// store answers, and recovers by itself.
		log.Error("lease store unreachable at start; serving 503 store_unavailable until it answers",
			"flag", "--"+flagLeaseStore, "url", redact.URL(l.url), "error", err)
	default:
		log.Info("lease store on Redis", "url", redact.URL(l.url), "prefix", l.prefix)
	}
	return s, func() { _ = s.Close() }, nil
}

// orNone is a file flag's value as an error shows it.
func orNone(path, none string) string {
	if path == "" {
		return none
	}
	return path
}
