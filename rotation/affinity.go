package rotation

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Pin is a (session, target)'s leased member, kept between requests.
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

// ErrAffinityFull is Set's refusal of a new pin when the table holds its
// maximum of live pins.
var ErrAffinityFull = errors.New("affinity: every place holds a live pin")

// Affinity maps (session, target) to a pinned lease until the pin's end,
// holding at most a maximum of live pins.
//
// It never evicts a live pin: a strict session must never move to another
// member behind its back, and a sticky one should not. So when it is full
// a new pin is refused (ErrAffinityFull) and the caller says so, instead
// of an eviction that would silently re-pin some other session. Expired
// pins are swept when a Set finds the table full (at most once a second)
// and every sweep interval in the background; a shard whose map shrank
// to a quarter of its peak is copied into a fresh one, so the memory of a
// burst of sessions is given back once they end (Go maps never shrink).
// Safe for concurrent use.
type Affinity struct {
	shards [affinityShards]affinityShard
	seed   maphash.Seed
	max    int64
	n      atomic.Int64 // pins held, live or not yet swept
	now    func() time.Time

	lastFullSweep atomic.Int64 // unix nanos
	stop          chan struct{}
	stopped       chan struct{}
	closeOnce     sync.Once
}

// affinityShards spreads the pins over locks: a Get takes one shard's.
const affinityShards = 32

// affinitySweepInterval is how often expired pins are swept in the
// background.
const affinitySweepInterval = 30 * time.Second

type affinityShard struct {
	mu   sync.Mutex
	m    map[string]pinEntry
	peak int // the map's largest size since it was made
}

// pinEntry is a Pin as held: its end as Unix nanoseconds (the earlier of
// the lease's end and the Set's ttl), 8 bytes rather than a time.Time's 24.
type pinEntry struct {
	leaseID, member string
	until           int64
	lost            bool
}

// NewAffinity makes a table holding at most maxEntries live pins, and
// starts its background sweep (Close stops it).
func NewAffinity(maxEntries int64) (*Affinity, error) {
	return newAffinity(maxEntries, affinitySweepInterval)
}

func newAffinity(maxEntries int64, sweep time.Duration) (*Affinity, error) {
	if maxEntries <= 0 {
		return nil, errors.New("affinity: maxEntries must be positive")
	}
	a := &Affinity{seed: maphash.MakeSeed(), max: maxEntries, now: time.Now, stop: make(chan struct{}), stopped: make(chan struct{})}
	for i := range a.shards {
		a.shards[i].m = map[string]pinEntry{}
	}
	go a.sweepEvery(sweep)
	return a, nil
}

// PinKey is the one key of a (session, target) pair: the affinity table's,
// and the gateway's for coalescing concurrent acquires of the same pair.
// NUL cannot occur in a session name or a host, so keys never collide.
func PinKey(session, target string) string {
	return session + "\x00" + target
}

func (a *Affinity) shard(key string) *affinityShard {
	return &a.shards[maphash.String(a.seed, key)%affinityShards]
}

// Get returns the live pin of (session, target). A pin whose end has
// passed is never returned, even if the table still holds it.
func (a *Affinity) Get(session, target string) (Pin, bool) {
	key := PinKey(session, target)
	s := a.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	s.mu.Unlock()
	if !ok || a.now().UnixNano() >= e.until {
		return Pin{}, false
	}
	return Pin{LeaseID: e.leaseID, Member: e.member, ExpiresAt: time.Unix(0, e.until), Lost: e.lost}, true
}

// Set pins (session, target) to p for ttl (and never past p.ExpiresAt
// when it is set); ttl <= 0 removes the pin. Replacing a pin always
// succeeds; a new one is refused with ErrAffinityFull when the table
// holds its maximum of live pins, except a Lost mark: it takes the place
// of the strict session's former pin (just dropped), and losing it would
// let that session be pinned afresh, so it is kept beyond the maximum.
func (a *Affinity) Set(session, target string, p Pin, ttl time.Duration) error {
	if ttl <= 0 {
		a.Delete(session, target)
		return nil
	}
	now := a.now()
	until := now.Add(ttl).UnixNano()
	if !p.ExpiresAt.IsZero() && p.ExpiresAt.UnixNano() < until {
		until = p.ExpiresAt.UnixNano()
	}
	e := pinEntry{leaseID: p.LeaseID, member: p.Member, until: until, lost: p.Lost}
	key := PinKey(session, target)
	s := a.shard(key)
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if _, ok := s.m[key]; ok {
			s.m[key] = e
			s.mu.Unlock()
			return nil
		}
		if a.n.Add(1) <= a.max || e.lost {
			s.m[key] = e
			s.peak = max(s.peak, len(s.m))
			s.mu.Unlock()
			return nil
		}
		a.n.Add(-1)
		s.mu.Unlock()
		if attempt > 0 || !a.sweepWhenFull(now) {
			return ErrAffinityFull
		}
	}
}

// Delete drops the pin of (session, target), e.g. after a ban on its lease.
func (a *Affinity) Delete(session, target string) {
	key := PinKey(session, target)
	s := a.shard(key)
	s.mu.Lock()
	if _, ok := s.m[key]; ok {
		delete(s.m, key)
		a.n.Add(-1)
	}
	s.mu.Unlock()
}

// Drain empties the table and returns the live pins that hold a lease
// (Lost marks hold none), for a gateway that stops: it releases them, so
// the leases of a crawler that finished do not outlive it in the pool for
// the rest of their TTL. A Set racing Drain may keep its pin; Drain is for
// when no request is left.
func (a *Affinity) Drain() []Pin {
	t := a.now().UnixNano()
	var out []Pin
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if t < e.until && !e.lost && e.leaseID != "" {
				out = append(out, Pin{LeaseID: e.leaseID, Member: e.member, ExpiresAt: time.Unix(0, e.until)})
			}
			delete(s.m, k)
			a.n.Add(-1)
		}
		s.mu.Unlock()
	}
	return out
}

// Max is the most live pins the table holds.
func (a *Affinity) Max() int64 { return a.max }

// Len is the number of pins held, live or not yet swept.
func (a *Affinity) Len() int64 { return a.n.Load() }

// sweepWhenFull sweeps every shard for a Set that found the table full,
// unless another sweep did so within the last second; false when it did
// not sweep.
func (a *Affinity) sweepWhenFull(now time.Time) bool {
	last := a.lastFullSweep.Load()
	if now.UnixNano()-last < int64(time.Second) || !a.lastFullSweep.CompareAndSwap(last, now.UnixNano()) {
		return false
	}
	a.sweep(now)
	return true
}

// sweep removes every pin whose end has passed and gives back the memory
// of shards that shrank to a quarter of their peak.
func (a *Affinity) sweep(now time.Time) {
	t := now.UnixNano()
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if t >= e.until {
				delete(s.m, k)
				a.n.Add(-1)
			}
		}
		if s.peak >= 64 && len(s.m) <= s.peak/4 {
			fresh := make(map[string]pinEntry, len(s.m))
			for k, e := range s.m {
				fresh[k] = e
			}
			s.m, s.peak = fresh, len(fresh)
		}
		s.mu.Unlock()
	}
}

func (a *Affinity) sweepEvery(d time.Duration) {
	defer close(a.stopped)
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			a.sweep(a.now())
		}
	}
}

// Close stops the background sweep. Call it once every user is done; the
// table still answers afterwards, it is only no longer swept.
func (a *Affinity) Close() {
	a.closeOnce.Do(func() { close(a.stop) })
	<-a.stopped
}
