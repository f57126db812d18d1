package rotation

import (
	"errors"
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// Pin is the lease a (session, target) pair is stuck to.
type Pin struct {
	LeaseID string
	Member  string
	// ExpiresAt is the lease's end; a pin is never returned at or past it.
	ExpiresAt time.Time
	// Lost marks a strict session whose member was banned, failed or
	// left: it holds no lease, only the fact, so the session is never
	// silently pinned to another member (LeaseID is empty).
	Lost bool
}

// Affinity maps (session, target) to a pinned lease with a per-entry TTL,
// bounded in size (ristretto evicts the least valuable entries when full).
//
// It is a cache, not a source of truth: ristretto may drop or evict an entry,
// and a lost pin only costs stickiness (the next request leases afresh),
// never correctness. Safe for concurrent use.
type Affinity struct {
	c   *ristretto.Cache[string, Pin]
	now func() time.Time
}

// NewAffinity makes a cache holding at most maxEntries pins.
func NewAffinity(maxEntries int64) (*Affinity, error) {
	if maxEntries <= 0 {
		return nil, errors.New("affinity: maxEntries must be positive")
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, Pin]{
		NumCounters:        10 * maxEntries,
		MaxCost:            maxEntries,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, err
	}
	return &Affinity{c: c, now: time.Now}, nil
}

// PinKey is the one key of a (session, target) pair: the affinity cache's,
// and the gateway's for coalescing concurrent acquires of the same pair.
// NUL cannot occur in a session name or a host, so keys never collide.
func PinKey(session, target string) string {
	return session + "\x00" + target
}

// Get returns the live pin of (session, target). A pin whose ExpiresAt has
// passed is never returned, even if the cache still holds it.
func (a *Affinity) Get(session, target string) (Pin, bool) {
	p, ok := a.c.Get(PinKey(session, target))
	if !ok {
		return Pin{}, false
	}
	if !p.ExpiresAt.IsZero() && !a.now().Before(p.ExpiresAt) {
		return Pin{}, false
	}
	return p, true
}

// Set pins (session, target) to p for ttl; ttl <= 0 removes the pin.
//
// Ristretto applies writes asynchronously and may drop them under
// contention. Set waits until the write is applied, so the next Get sees it,
// and retries once if the first attempt was dropped. A pin can still be
// refused by the admission policy when the cache is full; that costs only
// stickiness.
func (a *Affinity) Set(session, target string, p Pin, ttl time.Duration) {
	key := PinKey(session, target)
	if ttl <= 0 {
		a.Delete(session, target)
		return
	}
	if !a.c.SetWithTTL(key, p, 1, ttl) {
		a.c.Wait()
		a.c.SetWithTTL(key, p, 1, ttl)
	}
	a.c.Wait()
}

// Delete drops the pin of (session, target), e.g. after a ban on its lease.
func (a *Affinity) Delete(session, target string) {
	a.c.Del(PinKey(session, target))
}

// Close stops ristretto's goroutines. Call it once, after every user is done.
func (a *Affinity) Close() {
	a.c.Close()
}
