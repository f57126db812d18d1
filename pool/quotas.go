package pool

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// QuotaKeeper is a lease store that keeps clients' quotas (quota.Limits),
// so that a quota holds across every gateway on the store: the memory
// store for one process, the Redis store for a fleet. Each call decides
// and takes in one step; a refusal is a *quota.Refusal (quota.ErrExceeded)
// and takes nothing. Clients are named by the caller (a token client's
// name); their state lives while it matters (a rate's burst, a lease's
// TTL) and then leaves by itself.
type QuotaKeeper interface {
	// TakeRequest counts one request of client to site against l's rates
	// (overall and per site): both fit and are taken, or neither; and
	// refuses it when the client's bytes of today reached l.BytesPerDay.
	TakeRequest(ctx context.Context, client, site string, l quota.Limits) error
	// AddBytes counts n bytes a request of client carried today.
	AddBytes(ctx context.Context, client string, n int64) error
	// TakeLease takes one of client's l.Leases places for holder (a unique
	// id) for ttl, when fewer than l.Leases are held.
	TakeLease(ctx context.Context, client, holder string, l quota.Limits, ttl time.Duration) error
	// ReturnLease gives holder's place back; an unknown holder is fine.
	ReturnLease(ctx context.Context, client, holder string) error
}

// Quotas keeps the quota state of one process's clients: the memory
// store's QuotaKeeper, on the store's clock.
type Quotas struct {
	clock clock.PassiveClock

	mu      sync.Mutex
	clients map[string]*clientQuota
	sweepAt int
}

// clientQuota is one client's state: its rates' theoretical arrival
// times (overall, per site) and its leases' ends by holder.
type clientQuota struct {
	tat    time.Time
	sites  map[string]time.Time
	leases map[string]time.Time
	// day is the UTC day (quota.Day) bytes counts.
	day, bytes int64
}

// minQuotaSweep is the client count below which Quotas never sweeps.
const minQuotaSweep = 1024

// NewQuotas returns an empty quota book on c (the real clock when nil).
func NewQuotas(c clock.PassiveClock) *Quotas {
	if c == nil {
		c = clock.RealClock{}
	}
	return &Quotas{clock: c, clients: map[string]*clientQuota{}, sweepAt: minQuotaSweep}
}

func (q *Quotas) client(name string) *clientQuota {
	c := q.clients[name]
	if c == nil {
		if len(q.clients) >= q.sweepAt {
			q.sweep(q.clock.Now())
		}
		c = &clientQuota{}
		q.clients[name] = c
	}
	return c
}

// sweep drops what no longer limits anything: rates whose burst is whole
// again (their tat passed), leases past their end, clients left empty.
func (q *Quotas) sweep(now time.Time) {
	for name, c := range q.clients {
		c.prune(now)
		if c.tat.Before(now) && len(c.sites) == 0 && len(c.leases) == 0 && c.day != quota.Day(now) {
			delete(q.clients, name)
		}
	}
	q.sweepAt = max(minQuotaSweep, 2*len(q.clients))
}

func (c *clientQuota) prune(now time.Time) {
	for s, t := range c.sites {
		if t.Before(now) {
			delete(c.sites, s)
		}
	}
	for h, end := range c.leases {
		if !end.After(now) {
			delete(c.leases, h)
		}
	}
}

// TakeRequest is QuotaKeeper.TakeRequest (quota.TakeRates).
func (q *Quotas) TakeRequest(_ context.Context, client, site string, l quota.Limits) error {
	if l.RPS <= 0 && l.SiteRPS <= 0 && l.BytesPerDay <= 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	c := q.client(client)
	if l.BytesPerDay > 0 {
		used := int64(0)
		if c.day == quota.Day(now) {
			used = c.bytes
		}
		if ref := quota.TakeBytes(l, used, now); ref != nil {
			return ref
		}
	}
	var siteTat time.Time
	if l.SiteRPS > 0 {
		siteTat = c.sites[site]
	}
	tat, st, ref := quota.TakeRates(l, c.tat, siteTat, now)
	if ref != nil {
		return ref
	}
	c.tat = tat
	if l.SiteRPS > 0 {
		if c.sites == nil {
			c.sites = map[string]time.Time{}
		} else if len(c.sites) >= minQuotaSweep {
			c.prune(now)
		}
		c.sites[site] = st
	}
	return nil
}

// AddBytes is QuotaKeeper.AddBytes.
func (q *Quotas) AddBytes(_ context.Context, client string, n int64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	c := q.client(client)
	if d := quota.Day(now); c.day != d {
		c.day, c.bytes = d, 0
	}
	c.bytes += n
	return nil
}

// TakeLease is QuotaKeeper.TakeLease (quota.TakeLease over the client's
// unexpired places).
func (q *Quotas) TakeLease(_ context.Context, client, holder string, l quota.Limits, ttl time.Duration) error {
	if l.Leases <= 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	c := q.client(client)
	for h, end := range c.leases {
		if !end.After(now) {
			delete(c.leases, h)
		}
	}
	if ref := quota.TakeLease(l, len(c.leases)); ref != nil {
		return ref
	}
	if c.leases == nil {
		c.leases = map[string]time.Time{}
	}
	c.leases[holder] = now.Add(ttl)
	return nil
}

// ReturnLease is QuotaKeeper.ReturnLease.
func (q *Quotas) ReturnLease(_ context.Context, client, holder string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c := q.clients[client]; c != nil {
		delete(c.leases, holder)
	}
	return nil
}

// TakeRequest is Quotas.TakeRequest on the store's quota book.
func (s *Store) TakeRequest(ctx context.Context, client, site string, l quota.Limits) error {
	return s.quotas.TakeRequest(ctx, client, site, l)
}

// AddBytes is Quotas.AddBytes on the store's quota book.
func (s *Store) AddBytes(ctx context.Context, client string, n int64) error {
	return s.quotas.AddBytes(ctx, client, n)
}

// TakeLease is Quotas.TakeLease on the store's quota book.
func (s *Store) TakeLease(ctx context.Context, client, holder string, l quota.Limits, ttl time.Duration) error {
	return s.quotas.TakeLease(ctx, client, holder, l, ttl)
}

// ReturnLease is Quotas.ReturnLease on the store's quota book.
func (s *Store) ReturnLease(ctx context.Context, client, holder string) error {
	return s.quotas.ReturnLease(ctx, client, holder)
}
