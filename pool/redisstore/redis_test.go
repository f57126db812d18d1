package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func newRedisTestStore(t *testing.T, r *redis.Server, o pool.StoreOptions, names ...string) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "t" + strings.ReplaceAll(t.Name(), "/", "_"), Store: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ms := make([]pool.Member, 0, len(names))
	for _, n := range names {
		ms = append(ms, proxyMember(t, n))
	}
	if len(ms) > 0 {
		s.SetMembers(ms)
	}
	return s
}

func TestRedisStoreLeasesAndCooldownsSurviveARedisKillOnItsAOF(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Hour, Max: 2 * time.Hour}, MaxTTL: 2 * time.Hour}
	s := newRedisTestStore(t, r, o, "a", "b")
	l := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "site.com", TTL: time.Hour})
	cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
	before := memberStatus(t, s, "a").Cooldowns["site.com"]

	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	// Down: every call says store unavailable, nothing panics.
	if _, err := s.Acquire(context.Background(), pool.AcquireRequest{}); !errors.Is(err, pool.ErrStoreUnavailable) {
		t.Fatalf("acquire with redis down: %v, want pool.ErrStoreUnavailable", err)
	}
	if err := s.Release(context.Background(), l.ID); !errors.Is(err, pool.ErrStoreUnavailable) {
		t.Fatalf("release with redis down: %v", err)
	}
	if _, err := s.ListMembers(context.Background()); !errors.Is(err, pool.ErrStoreUnavailable) {
		t.Fatalf("list with redis down: %v", err)
	}
	r.Start()

	// A second store (another replica, a restarted controller) sees it all.
	s2, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "t" + t.Name(), Store: o})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	a := memberStatus(t, s2, "a")
	if a.ActiveLeases != 1 || !a.Cooldowns["site.com"].Equal(before) {
		t.Fatalf("after SIGKILL and AOF restart: a = %+v, want 1 lease and the cooldown until %v", a, before)
	}
	if got := cAcquire(t, s2, pool.AcquireRequest{Target: "site.com"}); got.Member.Name != "b" {
		t.Fatalf("site.com leased %s after the restart; a is banned there", got.Member.Name)
	}
	cRelease(t, s2, l.ID)
	if a := memberStatus(t, s2, "a"); a.ActiveLeases != 0 {
		t.Fatalf("the lease from before the restart did not release: %+v", a)
	}
}

func TestRedisStoreRewritesItsMembersAfterRedisLostThem(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{SweepInterval: 100 * time.Millisecond}, "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Start(ctx)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	s.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b")}) // fails: redis is down
	r.Start()
	poll.Until(t, 15*time.Second, "the members re-written after redis came back", func() error {
		if ms := s.Members(); len(ms) != 2 {
			return errors.New("members not re-written after redis came back")
		}
		return nil
	})
}

func TestParseRedisURL(t *testing.T) {
	good := []struct {
		raw     string
		addrs   string
		master  string
		db      int
		cluster bool
		tls     bool
		user    string
		pass    string
	}{
		{raw: "redis://127.0.0.1:6380/2", addrs: "127.0.0.1:6380", db: 2},
		{raw: "redis://u:p%40ss@h:1", addrs: "h:1", user: "u", pass: "p@ss"},
		{raw: "rediss://:pw@h:6379/0", addrs: "h:6379", tls: true, pass: "pw"},
		{raw: "redis+sentinel://s1:26379,s2:26379/mymaster/3", addrs: "s1:26379,s2:26379", master: "mymaster", db: 3},
		{raw: "redis+cluster://:pw@n1:7000,n2:7001", addrs: "n1:7000,n2:7001", cluster: true, pass: "pw"},
		{raw: "rediss+cluster://n1:7000", addrs: "n1:7000", cluster: true, tls: true},
	}
	for _, g := range good {
		o, err := ParseRedisURL(g.raw)
		if err != nil {
			t.Errorf("%s: %v", g.raw, err)
			continue
		}
		if strings.Join(o.Addrs, ",") != g.addrs || o.MasterName != g.master || o.DB != g.db || o.IsClusterMode != g.cluster ||
			(o.TLSConfig != nil) != g.tls || o.Username != g.user || o.Password != g.pass {
			t.Errorf("%s: parsed %+v", g.raw, o)
		}
	}
	for _, raw := range []string{
		"http://:hunter2@h:1", "redis://:hunter2@h", "redis://:hunter2@h:1,h:2", "redis://:hunter2@h:1/x",
		"redis+sentinel://:hunter2@s:1", "redis+cluster://:hunter2@n:1/3", "redis://:hunter2@h:99999", "hunter2@h:1",
		"redis://:hunter2@h:1/0?x=y", "redis://:ab/hunter2==@h:1/0", "redis+sentinel://:hunter2/@s:1,s:2/m",
	} {
		_, err := ParseRedisURL(raw)
		if err == nil {
			t.Errorf("%s: accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error shows the password: %v", raw, err)
		}
	}
	if _, err := NewRedisStore(RedisOptions{URL: "redis://h:1", Prefix: "a{b}"}); err == nil {
		t.Error("a prefix with braces was accepted")
	}
}

// TestRedisStoreEveryKeyHasATTL: acquires refresh the pool-wide keys' TTLs
// at most once a minute, so a key created in between (a sorted set that
// emptied and came back, the first sequence number) must get its TTL when
// it is born.
func TestRedisStoreEveryKeyHasATTL(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Hour, Max: 2 * time.Hour}, MaxTTL: 2 * time.Hour}
	s := newRedisTestStore(t, r, o, "a")
	check := func(when string) {
		t.Helper()
		v, err := r.Do("KEYS", "*")
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range v.([]any) {
			ttl, err := r.Do("PTTL", k.(string))
			if err != nil {
				t.Fatal(err)
			}
			if ttl.(int64) <= 0 {
				t.Errorf("%s: key %s has PTTL %d", when, k, ttl)
			}
		}
	}
	l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
	check("after the first acquire")
	cRelease(t, s, l.ID) // exp empties: Redis deletes it
	l = cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
	check("after exp came back")
	// The only member rests for every target: sel empties, rest is born.
	cReport(t, s, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
	check("after rest was born")
	cRelease(t, s, l.ID)
	s.SetHealth("a", false, 0)
	s.SetHealth("a", true, time.Millisecond)
	check("after sel came back")
}

func TestAStoreThatOwnsItsMembersParsesNoDefinitionOnAnAcquire(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{}, "a", "b")
	cached := func() int {
		n := 0
		s.defs.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	if n := cached(); n != 2 {
		t.Fatalf("%d parsed definitions after the member write, want both members'", n)
	}
	l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
	if n := cached(); n != 2 {
		t.Fatalf("the acquire parsed a definition again: %d cached", n)
	}
	if want := proxyMember(t, l.Member.Name); l.Member.URL.String() != want.URL.String() {
		t.Fatalf("leased %+v, want %s's URL %s", l.Member, want.Name, want.URL)
	}
}

// TestALeaseHoldsNoCopyOfItsMembersCredentials pins what a lease key keeps:
// leases stay an hour after they end (the report window), a fleet takes
// thousands a second, and a copy of the member's definition in each was
// most of a lease's memory and one more copy of the upstream's password
// per lease (in the AOF and on every replica too). The member's hash holds
// the credentials once; a retry's answer reads them there.
func TestALeaseHoldsNoCopyOfItsMembersCredentials(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{})
	m := proxyMember(t, "a")
	m.URL.User = url.UserPassword("crawler", "s3cret-Pa55")
	s.SetMembers([]pool.Member{m})
	l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
	again := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
	if again.ID != l.ID || again.Member.URL.String() != m.URL.String() {
		t.Fatalf("the retry's answer: %s on %v, want %s on %v", again.ID, again.Member.URL, l.ID, m.URL)
	}
	cRelease(t, s, l.ID)
	keys, err := r.Do("KEYS", "*:l:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.([]any)) != 1 {
		t.Fatalf("lease keys %v, want the one lease's", keys)
	}
	v, err := r.Do("HGETALL", keys.([]any)[0].(string))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(v); strings.Contains(got, "s3cret-Pa55") || strings.Contains(got, "crawler") {
		t.Fatalf("the lease key holds the member's credentials: %s", got)
	}
}

// TestDeferredReleasesKeepOnlyTheMostRecentLeases is the gateway's
// per-request cycle (the release carried by the next acquire) under the
// ReleasedRetained bound: Redis holds the most recent released leases and
// a sixteenth more before the oldest go, not every lease of the report
// window.
func TestDeferredReleasesKeepOnlyTheMostRecentLeases(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s := newRedisTestStore(t, r, pool.StoreOptions{ReleasedRetained: 32}, "a", "b")
	ctx := context.Background()
	var ids []string
	for range 200 {
		l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
		s.ReleaseLater(l.ID)
		ids = append(ids, l.ID)
	}
	if err := storebench.FlushLater(ctx, s); err != nil {
		t.Fatal(err)
	}
	keys, err := r.Do("KEYS", "*:l:*")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(keys.([]any)); n < 32 || n > 32+2 {
		t.Fatalf("%d lease keys after 200 released leases, want 32 to 34 (32 retained and up to a sixteenth more)", n)
	}
	if err := s.Report(ctx, ids[0], pool.Report{Result: rotation.ResultOK}); !errors.Is(err, pool.ErrUnknownLease) {
		t.Fatalf("report on the oldest released lease: %v, want pool.ErrUnknownLease", err)
	}
	cReport(t, s, ids[len(ids)-1], pool.Report{Result: rotation.ResultBanned})

	// A store of the same prefix that keeps fewer trims the list at its
	// first release.
	fewer, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: s.prefix, Store: pool.StoreOptions{ReleasedRetained: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer fewer.Close()
	cRelease(t, fewer, cAcquire(t, fewer, pool.AcquireRequest{Target: "site.com"}).ID)
	if keys, err = r.Do("KEYS", "*:l:*"); err != nil {
		t.Fatal(err)
	}
	if n := len(keys.([]any)); n != 4 {
		t.Fatalf("%d lease keys after a release by a store keeping 4, want 4", n)
	}
}
