package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/pool"
)

// DefaultFailoverWait is how long a call on redis+sentinel:// or
// redis+cluster:// retries while no primary answers. A Sentinel failover
// takes down-after-milliseconds plus an election (about 2s with 1s, 31s
// with Sentinel's default 30s); a Cluster one cluster-node-timeout plus an
// election. Calls carry their own deadlines too (a gateway's request), and
// the shorter wins.
const DefaultFailoverWait = 10 * time.Second

// replicaAckTimeout bounds the WAIT after an acquire or a cooldown; noAckPause is
// how long the store stops waiting after no replica acknowledged one in
// time (a replica down must not add the timeout to every ban).
const (
	replicaAckTimeout = 100 * time.Millisecond
	noAckPause        = 10 * time.Second
	// ackSlack is how much longer than its timeout a WAIT may take before
	// the client stops waiting for its answer: on a loaded machine Redis
	// answered WAIT 1 100 after up to 660ms, and a primary promoted a moment
	// ago has been seen to hold a WAIT for over a second.
	ackSlack = 400 * time.Millisecond
)

// ErrTLS is a TLS handshake with the lease store that failed: the server's
// certificate is not trusted (CAFile), it refused the client certificate,
// or it does not speak TLS. It never heals by itself, unlike an outage.
var ErrTLS = errors.New("TLS handshake with the lease store failed")

// ErrTLSClientCert marks an ErrTLS where the server refused (or wanted)
// the client certificate.
var ErrTLSClientCert = errors.New("the server refused the client certificate")

// TLSFileError is a CA or client certificate file that could not be used.
type TLSFileError struct {
	// Field is "CAFile" or "CertFile" (the certificate and its key).
	Field string
	Path  string
	Err   error
}

func (e *TLSFileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *TLSFileError) Unwrap() error { return e.Err }

// topology is what the store does differently on Sentinel and Cluster:
// ride out a failover, and wait for a replica after the writes that must
// survive one.
type topology struct {
	kind         string // "single", "sentinel" or "cluster"
	failoverWait time.Duration
	observe      func(op string, d time.Duration, err error)
	noAckUntil   atomic.Int64 // unix ms: no WAIT before
}

func newTopology(uo *redis.UniversalOptions, o RedisOptions) *topology {
	t := &topology{kind: "single", observe: o.Observe}
	switch {
	case uo.IsClusterMode:
		t.kind = "cluster"
	case uo.MasterName != "":
		t.kind = "sentinel"
	}
	switch {
	case o.FailoverWait > 0:
		t.failoverWait = o.FailoverWait
	case o.FailoverWait == 0 && t.kind != "single":
		t.failoverWait = DefaultFailoverWait
	}
	return t
}

// applyTLSFiles puts the CA and client certificate files into a TLS URL's
// configuration. A file with a TLS-less URL is an error: the operator meant
// TLS, and a plaintext connection must never be what they get.
func applyTLSFiles(uo *redis.UniversalOptions, caFile, certFile, keyFile string) error {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil
	}
	if uo.TLSConfig == nil {
		return errors.New("lease store: a CA or client certificate file needs a TLS URL (rediss://, rediss+sentinel://, rediss+cluster://)")
	}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return &TLSFileError{Field: "CAFile", Path: caFile, Err: err}
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return &TLSFileError{Field: "CAFile", Path: caFile, Err: errors.New("no PEM certificate in it")}
		}
		uo.TLSConfig.RootCAs = roots
	}
	if (certFile == "") != (keyFile == "") {
		return &TLSFileError{Field: "CertFile", Path: certFile + keyFile, Err: errors.New("a client certificate needs both its certificate and its key file")}
	}
	if certFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return &TLSFileError{Field: "CertFile", Path: certFile, Err: err}
		}
		uo.TLSConfig.Certificates = []tls.Certificate{kp}
	}
	return nil
}

// tlsError is err as an ErrTLS when a TLS handshake failed, else nil.
func tlsError(err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		host     x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		alert    tls.AlertError
		notTLSOK bool
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return fmt.Errorf("%w: the server's certificate is not trusted: %v", ErrTLS, err)
	case errors.As(err, &alert), strings.Contains(err.Error(), "remote error: tls: certificate required"),
		strings.Contains(err.Error(), "remote error: tls: bad certificate"), strings.Contains(err.Error(), "remote error: tls: unknown certificate"):
		// The server's alert (crypto/tls has no exported type for it).
		return fmt.Errorf("%w: %w: %v", ErrTLS, ErrTLSClientCert, err)
	case errors.As(err, &record):
		notTLSOK = true
	}
	if notTLSOK || strings.Contains(err.Error(), "first record does not look like a TLS handshake") {
		return fmt.Errorf("%w: the server does not speak TLS there: %v", ErrTLS, err)
	}
	return nil
}

// retryable is whether a failed call may succeed on a later try: the
// store is unavailable (a failover, a restart), not refusing us.
func (s *RedisStore) retryable(op string, err error) bool {
	if errors.Is(err, redis.Nil) || tlsError(err) != nil {
		return false
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") {
		return false
	}
	return errors.Is(s.wrap(op, err), pool.ErrStoreUnavailable)
}

// do runs fn, retried with backoff while the store is unavailable for up
// to the failover wait (and ctx), and tells Observe how it went.
func (s *RedisStore) do(ctx context.Context, op string, fn func(context.Context) error) error {
	start := time.Now()
	deadline := start.Add(s.topo.failoverWait)
	backoff := 25 * time.Millisecond
	// telling is the last error that was not the caller's deadline: when
	// the deadline ends the retries mid-dial, the error says what the
	// tries before it met (no Sentinel answered, the slot is not served).
	var err, telling error
	for {
		err = fn(ctx)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			telling = err
		}
		if err == nil || !s.retryable(op, err) || time.Now().Add(backoff).After(deadline) {
			break
		}
		if c, ok := s.rdb.(*redis.ClusterClient); ok {
			// go-redis reloads the slot map on MOVED and every 10s; a dead
			// primary answers no MOVED, so ask now who took its slots.
			c.ReloadState(ctx)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, 400*time.Millisecond)
	}
	if err != nil && telling != nil && err != telling {
		err = fmt.Errorf("%w; the tries before met: %w", err, telling)
	}
	if s.topo.observe != nil {
		var werr error
		if err != nil && !errors.Is(err, redis.Nil) {
			werr = s.wrap(op, err)
		}
		s.topo.observe(op, time.Since(start), werr)
	}
	return err
}

// runIn is one script call through do on keys (one member group's): a
// script that reads or writes members, leases or cooldowns runs on every
// group, or on the one its member or lease names.
func (s *RedisStore) runIn(ctx context.Context, op string, keys []string, sc *redis.Script, argv ...any) *redis.Cmd {
	var cmd *redis.Cmd
	_ = s.do(ctx, op, func(ctx context.Context) error {
		cmd = sc.Run(ctx, s.rdb, keys, argv...)
		return cmd.Err()
	})
	return cmd
}

// runAckedIn is runIn followed, when ack is set on Sentinel or Cluster, by
// WAIT 1 on the same connection: the call returns once a replica holds the
// script's writes (or after replicaAckTimeout), so a failover promoting
// that replica keeps them. A connection lost before the WAIT answered
// runs the script again (on the new primary). With no replica answering in
// time, the store stops waiting for noAckPause and logs it.
func (s *RedisStore) runAckedIn(ctx context.Context, op string, keys []string, ack bool, sc *redis.Script, argv ...any) *redis.Cmd {
	if !ack || s.topo.kind == "single" || time.Now().UnixMilli() < s.topo.noAckUntil.Load() {
		return s.runIn(ctx, op, keys, sc, argv...)
	}
	var cmd *redis.Cmd
	err := s.do(ctx, op, func(ctx context.Context) error {
		cmd = nil
		var node *redis.Client
		switch c := s.rdb.(type) {
		case *redis.ClusterClient:
			n, err := c.MasterForKey(ctx, keys[0])
			if err != nil {
				return err
			}
			node = n
		case *redis.Client:
			node = c
		default:
			cmd = sc.Run(ctx, s.rdb, keys, argv...)
			return cmd.Err()
		}
		var (
			wait *redis.Cmd
			wctx context.Context
		)
		for range 2 {
			// Each try has the WAIT's whole time: a NOSCRIPT's WAIT runs
			// too and may use it all (no replica answering), which left
			// the SCRIPT LOAD after it no time, and the call answered
			// with the NOSCRIPT (an e2e run: 3 of 426 across a primary
			// kill).
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, replicaAckTimeout+ackSlack)
			defer cancel()
			_, _ = node.Pipelined(wctx, func(p redis.Pipeliner) error {
				cmd = sc.EvalSha(wctx, p, keys, argv...)
				wait = p.Do(wctx, "wait", 1, replicaAckTimeout.Milliseconds())
				return nil
			})
			if err := cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
				break
			}
			if err := sc.Load(ctx, node).Err(); err != nil {
				return err
			}
		}
		if err := cmd.Err(); err != nil {
			if msg := err.Error(); strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "NOSCRIPT") {
				// The slot moved since MasterForKey, or the script is
				// still unknown where the call landed after loading it (a
				// failover between the two: a promoted replica has no
				// scripts; an e2e run answered 2 of 460 requests 503
				// pool_error with NOSCRIPT across a primary kill): the
				// cluster client's Run follows the slot and falls back to
				// EVAL; the next call waits again.
				cmd = sc.Run(ctx, s.rdb, keys, argv...)
				return cmd.Err()
			}
			return err
		}
		n, err := wait.Int64()
		if err != nil && wctx.Err() == nil && s.retryable(op, err) {
			return err // the primary went before a replica had it: again
		}
		if err != nil || n < 1 {
			s.topo.noAckUntil.Store(time.Now().Add(noAckPause).UnixMilli())
			s.log.Warn("lease store: no replica acknowledged a lease or a cooldown in time; it holds on the primary, and a failover now could lose it; not waiting for replicas for a while",
				"timeout", replicaAckTimeout, "pause", noAckPause, "error", err)
		}
		return nil
	})
	if err != nil && (cmd == nil || cmd.Err() != nil) {
		// The call did not run to an answer: what ended the tries (no
		// primary for the key, a script that would not load) is the
		// answer, not the NOSCRIPT of a try before it. A script that ran
		// and only missed its replica's ack keeps its answer.
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// clientLog routes go-redis' own log lines (a failed dial, a Sentinel that
// did not answer: many a second during a failover) to the store's logger
// at debug, instead of raw lines on stderr beside the process's records.
type clientLog struct{ log *slog.Logger }

func (l clientLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug("lease store: redis client: " + fmt.Sprintf(format, v...))
}

// setClientLog installs the first store's logger as go-redis' (a process
// has one store; the setting is global to go-redis).
var setClientLog sync.Once
