package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// quotas is the part of the request path that keeps token clients to
// their quotas (their --auth-token-file line's leases=, rps=, site-rps=,
// bytes-per-day=)
// in the lease store (pool.QuotaKeeper), so a quota holds across every
// gateway on the store: a request's rates are taken before it leases
// anything, a lease's place before the pool is asked, and a place is
// given back when its lease ends. A request past a quota is a 429
// quota_exceeded with Retry-After; nothing was leased or sent.
//
// A store that does not answer does not stop the crawl: the request goes
// on as if within its quota (the pool's own outage handling decides
// whether it is served), and the failure is logged.
type quotas struct {
	keep pool.QuotaKeeper // nil: no client has a quota
	by   map[string]quota.Limits
	log  *slog.Logger

	mu      sync.Mutex
	places  map[string]place // by lease id: the place its lease holds
	sweepAt int
}

// place is one lease's place in its client's lease quota.
type place struct {
	client, holder string
	end            time.Time
}

// minPlacesSweep is the count of places below which none is swept.
const minPlacesSweep = 1024

// newQuotas returns the quota part for cs on keep; an error when a
// client has a quota and keep is nil (a pool that keeps no quotas).
func newQuotas(cs []clients.Client, keep pool.QuotaKeeper, log *slog.Logger) (*quotas, error) {
	q := &quotas{keep: keep, by: map[string]quota.Limits{}, log: log, places: map[string]place{}, sweepAt: minPlacesSweep}
	for _, c := range cs {
		if c.Quota.IsZero() {
			continue
		}
		if err := c.Quota.Check(); err != nil {
			return nil, errors.New("gateway: client " + c.Name + ": " + err.Error())
		}
		if keep == nil {
			return nil, errors.New("gateway: client " + c.Name + " has a quota, and this gateway's pool keeps none: quotas live in the lease store (--lease-store: memory for one gateway, redis:// for several, or the --lease-api's)")
		}
		q.by[c.Name] = c.Quota
	}
	return q, nil
}

// quotaError is a request of client past one of its quotas.
type quotaError struct {
	client string
	ref    *quota.Refusal
}

func (e *quotaError) Error() string {
	return "client " + e.client + ": " + e.ref.Error() + " (its --auth-token-file line; docs/tenancy.md#quotas)"
}

func (e *quotaError) Unwrap() error { return e.ref }

// refused is err as the request's quota answer, or nil when err is the
// store's own failure (logged: the request goes on).
func (q *quotas) refused(client string, err error) error {
	var ref *quota.Refusal
	if errors.As(err, &ref) {
		return &quotaError{client: client, ref: ref}
	}
	if err != nil {
		q.log.Warn("quota not checked: the lease store did not answer; the request goes on", "client", client, "err", err)
	}
	return nil
}

// admit takes one request of lr's client to its site from the client's
// rates, and refuses it once the client's bytes of today reached its
// quota.
func (q *quotas) admit(ctx context.Context, lr *leaseReq) error {
	l, ok := q.by[lr.p.Client]
	if !ok || (l.RPS <= 0 && l.SiteRPS <= 0 && l.BytesPerDay <= 0) {
		return nil
	}
	return q.refused(lr.p.Client, q.keep.TakeRequest(ctx, lr.p.Client, lr.target, l))
}

// spent counts n bytes a request of client carried (both ways) toward its
// bytes-per-day quota.
func (q *quotas) spent(ctx context.Context, client string, n int64) {
	if l, ok := q.by[client]; !ok || l.BytesPerDay <= 0 || n <= 0 {
		return
	}
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if err := q.keep.AddBytes(ctx, client, n); err != nil {
		q.log.Warn("quota bytes not counted: the lease store did not answer", "client", client, "bytes", n, "err", err)
	}
}

// take takes a place in client's lease quota for a lease of ttl about to
// be asked for: its holder id, "" when the client has no lease quota (or
// the store did not answer).
func (q *quotas) take(ctx context.Context, client string, ttl time.Duration) (string, error) {
	l, ok := q.by[client]
	if !ok || l.Leases <= 0 {
		return "", nil
	}
	var raw [12]byte
	_, _ = rand.Read(raw[:])
	holder := hex.EncodeToString(raw[:])
	if err := q.refused(client, q.keep.TakeLease(ctx, client, holder, l, ttl)); err != nil {
		return "", err
	}
	return holder, nil
}

// leased binds holder's place to the lease leaseID got, until it ends.
func (q *quotas) leased(client, holder, leaseID string, end time.Time) {
	if holder == "" {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.places) >= q.sweepAt {
		// Places of leases that ended without a release (a pin left to
		// expire) have ended in the store too.
		now := time.Now()
		for id, p := range q.places {
			if p.end.Before(now) {
				delete(q.places, id)
			}
		}
		q.sweepAt = max(minPlacesSweep, 2*len(q.places))
	}
	q.places[leaseID] = place{client: client, holder: holder, end: end}
}

// giveBack returns a place taken for a lease the pool did not give.
func (q *quotas) giveBack(ctx context.Context, client, holder string) {
	if holder == "" {
		return
	}
	ctx, cancel := bgCtx(ctx)
	defer cancel()
	if err := q.keep.ReturnLease(ctx, client, holder); err != nil {
		q.log.Debug("quota place not returned (it ends with its TTL)", "client", client, "err", err)
	}
}

// ended returns the place of leaseID's lease, if it holds one.
func (q *quotas) ended(ctx context.Context, leaseID string) {
	if q.keep == nil {
		return
	}
	q.mu.Lock()
	p, ok := q.places[leaseID]
	delete(q.places, leaseID)
	q.mu.Unlock()
	if ok {
		q.giveBack(ctx, p.client, p.holder)
	}
}
