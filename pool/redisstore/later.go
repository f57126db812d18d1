package redisstore

import (
	"context"
	"sync"
	"time"
)

// Deferred releases. A gateway's per-request lease is released as the
// request ends and the gateway does not wait on the answer, so the store
// need not send it on its own round trip: ReleaseLater keeps the lease ID,
// the next acquire on its group carries it (the script applies it before
// it chooses, so this store's next choice sees it), and a timer sends
// whatever no acquire carried within defaultLaterDelay. An acquire+release
// cycle is then one round trip and one script run instead of two.
const (
	// defaultLaterDelay bounds how long another gateway or replica may
	// still see a deferred release's member as leased.
	defaultLaterDelay = 2 * time.Millisecond
	// maxCarried bounds the releases one acquire or release carries, so a
	// backlog after an outage never makes one script long.
	maxCarried = 64
	// defaultMaxLater bounds the releases kept while Redis cannot be
	// reached; beyond it the oldest are dropped (their leases end by their
	// TTL).
	defaultMaxLater = 100_000
	// laterRetry is how often a flush that failed is tried again.
	laterRetry = time.Second
	// closeFlushWait bounds Close's last flush.
	closeFlushWait = 2 * time.Second
)

// laterReleases are the lease IDs ReleaseLater kept, by member group, and
// the timer that sends them.
type laterReleases struct {
	delay time.Duration // defaultLaterDelay; tests set their own
	max   int           // defaultMaxLater; tests set their own

	mu  sync.Mutex
	ids map[int][]string
	n   int
	// sending counts, by group, the flushes on their way to Redis; an
	// acquire or release on that group waits for them (sent), so that
	// this store never chooses before a release it was given.
	sending map[int]int
	sent    sync.Cond
	timer   *time.Timer
	stopped bool
	failing bool // the last flush failed (logged once per outage)
}

// init readies l: its delay and bound, its maps, its condition.
func (l *laterReleases) init(delay time.Duration, bound int) {
	l.delay, l.max = delay, bound
	l.ids, l.sending = map[int][]string{}, map[int]int{}
	l.sent.L = &l.mu
}

// ReleaseLater ends a lease like Release without waiting for Redis: the
// release goes with this store's next acquire on the lease's group, or on
// its own within defaultLaterDelay, and it is kept and sent again while Redis
// cannot be reached. The gateway releases its per-request leases this way
// (pool.LaterReleaser); the lease API's DELETE uses Release, whose answer
// says the release happened.
func (s *RedisStore) ReleaseLater(leaseID string) {
	g := s.leaseShard(leaseID)
	l := &s.later
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if l.n >= l.max {
		// The oldest of the largest backlog goes: its lease ends by TTL.
		big := g
		for k, v := range l.ids {
			if len(v) > len(l.ids[big]) {
				big = k
			}
		}
		l.ids[big] = l.ids[big][1:]
		l.n--
	}
	l.ids[g] = append(l.ids[g], leaseID)
	l.n++
	l.scheduleLocked(s, l.delay)
}

// scheduleLocked starts the flush timer unless one is waiting.
func (l *laterReleases) scheduleLocked(s *RedisStore, d time.Duration) {
	if l.timer != nil || l.stopped {
		return
	}
	l.timer = time.AfterFunc(d, func() {
		ctx, cancel := context.WithTimeout(context.Background(), laterRetry+s.topo.failoverWait)
		defer cancel()
		s.flushLater(ctx)
	})
}

// take removes and returns up to limit of group g's waiting IDs, oldest
// first, once no flush of group g is on its way.
func (l *laterReleases) take(g, limit int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.sending[g] > 0 {
		l.sent.Wait()
	}
	return l.takeLocked(g, limit)
}

// takeForSend is take for a flush: the group counts as sending until done.
func (l *laterReleases) takeForSend(g, limit int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := l.takeLocked(g, limit)
	if len(ids) > 0 {
		l.sending[g]++
	}
	return ids
}

// done ends a flush takeForSend began; a failed one's IDs go back first.
func (l *laterReleases) done(g int, failed []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.giveBackLocked(g, failed)
	l.sending[g]--
	l.sent.Broadcast()
}

func (l *laterReleases) takeLocked(g, limit int) []string {
	v := l.ids[g]
	if len(v) == 0 {
		return nil
	}
	k := min(len(v), limit)
	out := append([]string(nil), v[:k]...)
	if k == len(v) {
		delete(l.ids, g)
	} else {
		l.ids[g] = v[k:]
	}
	l.n -= k
	return out
}

// giveBack returns IDs a failed call carried to the front of group g's.
func (l *laterReleases) giveBack(g int, ids []string) {
	if len(ids) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.giveBackLocked(g, ids)
}

func (l *laterReleases) giveBackLocked(g int, ids []string) {
	if len(ids) == 0 || l.stopped {
		return
	}
	l.ids[g] = append(append([]string(nil), ids...), l.ids[g]...)
	l.n += len(ids)
}

// stop ends the timer; later calls keep nothing.
func (l *laterReleases) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	clear(l.ids)
	l.n = 0
}

// flushLater sends every group's waiting releases. When Redis cannot be
// reached they are kept and tried again after laterRetry; the first
// failure of an outage is logged, and its end.
func (s *RedisStore) flushLater(ctx context.Context) {
	l := &s.later
	l.mu.Lock()
	l.timer = nil
	groups := make([]int, 0, len(l.ids))
	for g := range l.ids {
		groups = append(groups, g)
	}
	l.mu.Unlock()
	var failed error
	for _, g := range groups {
		for failed == nil {
			ids := l.takeForSend(g, 8*maxCarried)
			if len(ids) == 0 {
				break
			}
			if err := s.releaseIn(ctx, g, ids); err != nil {
				failed = err
				l.done(g, ids)
			} else {
				l.done(g, nil)
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case failed != nil:
		if !l.failing {
			s.log.Warn("lease store: deferred lease releases not sent; keeping them and trying again", "waiting", l.n, "retry", laterRetry, "error", failed)
		}
		l.failing = true
		l.scheduleLocked(s, laterRetry)
	case l.failing:
		l.failing = false
		s.log.Info("lease store: deferred lease releases sent again")
	}
}
