package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// scriptCalls is how many scripts redis-server ran since the last RESETSTAT.
func scriptCalls(t *testing.T, r *redis.Server) int {
	t.Helper()
	info, err := r.Info("commandstats")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		var calls int
		if v, ok := info[cmd]; ok {
			if _, err := fmt.Sscanf(v, "calls=%d", &calls); err != nil {
				t.Fatalf("%s: %q: %v", cmd, v, err)
			}
		}
		n += calls
	}
	return n
}

// activeLeases is name's active lease count as s sees it, or an error.
func activeLeases(s *RedisStore, name string, want int) error {
	ms, err := s.ListMembers(context.Background())
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.Name == name {
			return poll.Check(m.ActiveLeases == want, "%s has %d active leases, want %d", name, m.ActiveLeases, want)
		}
	}
	return fmt.Errorf("member %s not listed", name)
}

func TestReleaseLaterGoesWithTheNextAcquireInOneScript(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{MaxLeasesPerMember: 1}, "a")
	s.later.delay = time.Hour // only an acquire can carry it
	l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
	if _, err := r.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	s.ReleaseLater(l.ID)
	// a holds its only place until the release is applied: without it
	// riding along, this acquire is refused at capacity.
	next := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
	if next.Member.Name != "a" {
		t.Fatalf("leased %s", next.Member.Name)
	}
	if n := scriptCalls(t, r); n != 1 {
		t.Fatalf("the release and the acquire took %d scripts, want one", n)
	}
	// Released once: releasing it again, the next lease still counts.
	cRelease(t, s, l.ID)
	if err := activeLeases(s, "a", 1); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseLaterReachesOtherReplicasOnItsOwn(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	o := pool.StoreOptions{MaxLeasesPerMember: 1}
	s := newRedisTestStore(t, r, o, "a")
	other, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "t" + t.Name(), Store: o})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
	s.ReleaseLater(l.ID)
	// No acquire follows on s: its timer sends the release.
	poll.Until(t, 10*time.Second, "the other replica sees the release", func() error { return activeLeases(other, "a", 0) })
	cAcquire(t, other, pool.AcquireRequest{Target: "site.com"})
}

func TestReleaseLaterKeepsReleasesWhileRedisIsDown(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{}, "a")
	s.later.delay = time.Hour
	held := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", TTL: time.Hour})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	s.ReleaseLater(held.ID)
	// An acquire that fails gives the release it carried back.
	if _, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "site.com"}); !errors.Is(err, pool.ErrStoreUnavailable) {
		t.Fatalf("acquire with redis down: %v", err)
	}
	r.Start()
	if err := activeLeases(s, "a", 1); err != nil {
		t.Fatalf("after the restart (AOF): %v", err)
	}
	if err := s.Close(); err != nil { // Close sends what waits
		t.Fatal(err)
	}
	other, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "t" + t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := activeLeases(other, "a", 0); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

func TestReleaseLaterRetriesAFailedFlushUntilRedisIsBack(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{}, "a")
	s.later.delay = time.Millisecond
	held := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", TTL: time.Hour})
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	s.ReleaseLater(held.ID)
	poll.Until(t, 10*time.Second, "the flush fails and keeps the release", func() error {
		s.later.mu.Lock()
		defer s.later.mu.Unlock()
		return poll.Check(s.later.failing && s.later.n == 1, "failing %v, waiting %d", s.later.failing, s.later.n)
	})
	r.Start()
	poll.Until(t, 30*time.Second, "the retried flush releases the lease", func() error { return activeLeases(s, "a", 0) })
}

func TestReleaseLaterKeepsAtMostItsBoundWhileRedisIsDown(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{}, "a")
	s.later.delay, s.later.max = time.Hour, 3
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		s.ReleaseLater(fmt.Sprintf("lease-%d", i))
	}
	got := s.later.take(0, 10)
	if want := []string{"lease-2", "lease-3", "lease-4"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("kept %v, want the newest three %v", got, want)
	}
}

func TestReleaseLaterOnGroupsReachesEveryGroup(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	o := RedisOptions{URL: r.URL(), Prefix: "t" + t.Name(), Shards: 3}
	s, err := NewRedisStore(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.later.delay = time.Hour
	var names []string
	for i := range 9 {
		names = append(names, fmt.Sprintf("m%d", i))
	}
	ms := make([]pool.Member, 0, len(names))
	for _, n := range names {
		ms = append(ms, proxyMember(t, n))
	}
	s.SetMembers(ms)
	groups := map[int]bool{}
	for _, n := range names {
		l := cAcquire(t, s, pool.AcquireRequest{Proxy: n, Target: "site.com"})
		groups[s.leaseShard(l.ID)] = true
		s.ReleaseLater(l.ID)
	}
	if len(groups) != 3 {
		t.Fatalf("the leases named groups %v, want all three", groups)
	}
	s.flushLater(context.Background())
	for _, n := range names {
		if err := activeLeases(s, n, 0); err != nil {
			t.Fatalf("after the flush: %v", err)
		}
	}
}
