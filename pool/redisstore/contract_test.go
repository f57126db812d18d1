package redisstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The contract suite of pool.LeaseStore: every case runs against the
// in-memory pool.Store and the RedisStore (on a real redis-server), on the real clock, so the two
// backends are held to one behaviour. Windows are a few hundred
// milliseconds; assertions allow for a loaded machine.

// contractBackend makes a fresh, empty store of one kind.
type contractBackend struct {
	name string
	make func(t *testing.T, o pool.StoreOptions) pool.LeaseStore
	// sharded: members are split into groups (RedisOptions.Shards), so
	// rotation.Less orders the choice within a group, not fleet-wide.
	sharded bool
}

var contractPrefixes atomic.Int64

// sharedTopologies are one Sentinel topology and one Cluster for the whole
// package (started by the first contract test, closed by TestMain): every
// store on them has a prefix of its own, and starting them per test would
// cost seconds each.
var sharedTopologies struct {
	once     sync.Once
	sentinel *redis.Sentinel
	cluster  *redis.Cluster
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if rs := sharedTopologies.sentinel; rs != nil {
		_ = rs.Close()
	}
	if rc := sharedTopologies.cluster; rc != nil {
		_ = rc.Close()
	}
	os.Exit(code)
}

// topologies are the shared Sentinel and Cluster, started on first use.
func topologies(t *testing.T) (*redis.Sentinel, *redis.Cluster) {
	t.Helper()
	st := &sharedTopologies
	st.once.Do(func() {
		var wg sync.WaitGroup
		var errS, errC error
		wg.Go(func() {
			st.sentinel, errS = redis.LaunchSentinel(redis.SentinelTopology{Password: "contract-pw"})
		})
		wg.Go(func() { st.cluster, errC = redis.LaunchCluster(redis.ClusterTopology{}) })
		wg.Wait()
		st.err = errors.Join(errS, errC)
	})
	if st.err != nil {
		t.Fatal(st.err)
	}
	return st.sentinel, st.cluster
}

func contractBackends(t *testing.T) []contractBackend {
	r := redis.Start(t, redis.Options{})
	rs, rc := topologies(t)
	onShards := func(url string, shards int) func(t *testing.T, o pool.StoreOptions) pool.LeaseStore {
		return func(t *testing.T, o pool.StoreOptions) pool.LeaseStore {
			s, err := NewRedisStore(RedisOptions{URL: url, Prefix: fmt.Sprintf("contract%d", contractPrefixes.Add(1)), Store: o, Shards: shards})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	}
	on := func(url string) func(t *testing.T, o pool.StoreOptions) pool.LeaseStore { return onShards(url, 1) }
	return []contractBackend{
		{"memory", func(t *testing.T, o pool.StoreOptions) pool.LeaseStore { return pool.NewStore(o) }, false},
		{"redis", on(r.URL()), false},
		{"sentinel", on(rs.URL()), false},
		{"cluster", on(rc.URL()), false},
		{"cluster-3-shards", onShards(rc.URL(), 3), true},
	}
}

// proxyMember is a member named name on a placeholder proxy address, with
// attrs as key, value pairs.
func proxyMember(t testing.TB, name string, attrs ...string) pool.Member {
	t.Helper()
	u := &url.URL{Scheme: "http", Host: "127.0.0.1:3128"}
	m := pool.Member{Name: name, URL: u, Attributes: map[string]string{}}
	for i := 0; i+1 < len(attrs); i += 2 {
		m.Attributes[attrs[i]] = attrs[i+1]
	}
	return m
}

// noMatch is err as a *pool.NoMatchError, failing the test when it is not one.
func noMatch(t testing.TB, err error) pool.NoMatchError {
	t.Helper()
	var nm *pool.NoMatchError
	if !errors.As(err, &nm) {
		t.Fatalf("error = %v, want *NoMatchError", err)
	}
	return *nm
}

// runContract runs fn as a subtest per backend.
func runContract(t *testing.T, fn func(t *testing.T, mk func(o pool.StoreOptions, names ...string) pool.LeaseStore)) {
	runContractOn(t, func(contractBackend) bool { return true }, fn)
}

// runContractOn runs fn as a subtest per backend that use accepts.
func runContractOn(t *testing.T, use func(contractBackend) bool, fn func(t *testing.T, mk func(o pool.StoreOptions, names ...string) pool.LeaseStore)) {
	for _, b := range contractBackends(t) {
		if !use(b) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			fn(t, func(o pool.StoreOptions, names ...string) pool.LeaseStore {
				s := b.make(t, o)
				ms := make([]pool.Member, 0, len(names))
				for _, n := range names {
					ms = append(ms, proxyMember(t, n))
				}
				s.SetMembers(ms)
				return s
			})
		})
	}
}

func cAcquire(t testing.TB, s pool.LeaseStore, req pool.AcquireRequest) pool.Lease {
	t.Helper()
	l, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", req, err)
	}
	return l
}

func cReport(t testing.TB, s pool.LeaseStore, id string, r pool.Report) {
	t.Helper()
	if err := s.Report(context.Background(), id, r); err != nil {
		t.Fatalf("Report(%s, %+v): %v", id, r, err)
	}
}

func cRelease(t testing.TB, s pool.LeaseStore, id string) {
	t.Helper()
	if err := s.Release(context.Background(), id); err != nil {
		t.Fatalf("Release(%s): %v", id, err)
	}
}

func memberStatus(t testing.TB, s pool.LeaseStore, name string) pool.MemberStatus {
	t.Helper()
	for _, m := range s.Members() {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("member %s not listed", name)
	return pool.MemberStatus{}
}

// cooldownLeft is how long name still cools down for target (0: none).
func cooldownLeft(t testing.TB, s pool.LeaseStore, name, target string) time.Duration {
	t.Helper()
	until, ok := memberStatus(t, s, name).Cooldowns[target]
	if !ok {
		return 0
	}
	return time.Until(until)
}

// wantWindow checks a fresh cooldown of about w: at most w (plus clock
// rounding), and not much less (the report was just made).
func wantWindow(t testing.TB, what string, got, w time.Duration) {
	t.Helper()
	if got > w+20*time.Millisecond || got < w-400*time.Millisecond {
		t.Fatalf("%s: cooldown left %v, want about %v", what, got, w)
	}
}

func waitNoCooldown(t testing.TB, s pool.LeaseStore, name, target string) {
	t.Helper()
	poll.Until(t, 10*time.Second, name+"'s cooldown on "+target+" to end", func() error {
		if left := cooldownLeft(t, s, name, target); left > 0 {
			return fmt.Errorf("%s still cools down for %q for %v", name, target, left)
		}
		return nil
	})
}

func TestStoreContractSelectionOrder(t *testing.T) {
	// The fleet-wide order; a sharded store orders within each group
	// (TestStoreShardsTakeGroupsInTurn).
	runContractOn(t, func(b contractBackend) bool { return !b.sharded }, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		t.Run("fewest active leases first", func(t *testing.T) {
			s := mk(pool.StoreOptions{}, "a", "b", "c")
			held := map[string]int{}
			for range 6 {
				held[cAcquire(t, s, pool.AcquireRequest{}).Member.Name]++
			}
			for _, n := range []string{"a", "b", "c"} {
				if held[n] != 2 {
					t.Errorf("%s holds %d of 6 leases, want 2 (%v)", n, held[n], held)
				}
			}
		})
		t.Run("least recently chosen, then latency, unknown last, then name", func(t *testing.T) {
			s := mk(pool.StoreOptions{}, "d", "a", "b", "c")
			s.SetHealth("a", true, 0)
			s.SetHealth("b", true, 50*time.Millisecond)
			s.SetHealth("c", true, 5*time.Millisecond)
			var got []string
			for range 8 {
				l := cAcquire(t, s, pool.AcquireRequest{})
				got = append(got, l.Member.Name)
				cRelease(t, s, l.ID)
			}
			// c, b by latency; a and d unknown, by name; then the cycle repeats by last choice.
			if want := "c,b,a,d,c,b,a,d"; strings.Join(got, ",") != want {
				t.Errorf("order = %v, want %s", got, want)
			}
		})
		t.Run("selector and pin", func(t *testing.T) {
			s := mk(pool.StoreOptions{})
			s.SetMembers([]pool.Member{proxyMember(t, "eu1", "region", "eu"), proxyMember(t, "us1", "region", "us"), proxyMember(t, "eu2", "region", "eu", "tier", "dc")})
			for range 4 {
				l := cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
				if !strings.HasPrefix(l.Member.Name, "eu") {
					t.Fatalf("selector region=eu leased %s", l.Member.Name)
				}
			}
			if l := cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"region": "eu", "tier": "dc"}}); l.Member.Name != "eu2" {
				t.Fatalf("two-pair selector leased %s, want eu2", l.Member.Name)
			}
			if l := cAcquire(t, s, pool.AcquireRequest{Proxy: "us1"}); l.Member.Name != "us1" || l.Member.URL == nil || l.Member.URL.Host != "127.0.0.1:3128" {
				t.Fatalf("pin us1 leased %+v", l.Member)
			}
			_, err := s.Acquire(context.Background(), pool.AcquireRequest{Selector: map[string]string{"region": "mars"}})
			if nm := noMatch(t, err); nm != (pool.NoMatchError{}) {
				t.Fatalf("selector nobody carries: counts %+v, want all zero", nm)
			}
			_, err = s.Acquire(context.Background(), pool.AcquireRequest{Proxy: "nobody"})
			if nm := noMatch(t, err); nm != (pool.NoMatchError{}) {
				t.Fatalf("pin to an unknown member: counts %+v, want all zero", nm)
			}
		})
	})
}

func TestStoreContractCapacityAndExactRefusalCounts(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		s := mk(pool.StoreOptions{MaxLeasesPerMember: 1}, "a", "b", "c", "d")
		s.SetHealth("b", false, 0)
		cl := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "x.com"})
		cReport(t, s, cl.ID, pool.Report{Result: rotation.ResultBanned})
		cRelease(t, s, cl.ID)
		first := cAcquire(t, s, pool.AcquireRequest{Target: "x.com"})
		if first.Member.Name != "a" {
			t.Fatalf("first lease on %s, want a (b unhealthy, c cooling, a before d by name)", first.Member.Name)
		}
		if l := cAcquire(t, s, pool.AcquireRequest{Target: "x.com"}); l.Member.Name != "d" {
			t.Fatalf("second lease on %s, want d", l.Member.Name)
		}
		_, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "x.com"})
		want := pool.NoMatchError{Considered: 4, AtCapacity: 2, InCooldown: 1, Unhealthy: 1}
		if nm := noMatch(t, err); nm != want {
			t.Fatalf("refusal counts %+v, want %+v", nm, want)
		}
		// The same member at capacity and in cooldown counts as in cooldown
		// (judge's order); every member considered resting, the refusal
		// says when the first is back (the default 10m ban).
		_, err = s.Acquire(context.Background(), pool.AcquireRequest{Proxy: "c", Target: "x.com"})
		if nm := noMatch(t, err); nm.Considered != 1 || nm.InCooldown != 1 || nm.RetryAfterSeconds < 590 || nm.RetryAfterSeconds > 600 {
			t.Fatalf("pinned refusal %+v, want 1 considered in cooldown, back in about 600s", nm)
		}
		// Another target: c is free there.
		if l := cAcquire(t, s, pool.AcquireRequest{Target: "y.com"}); l.Member.Name != "c" {
			t.Fatalf("y.com lease on %s, want c", l.Member.Name)
		}
	})
}

func TestStoreContractConcurrentAcquiresRespectCapacity(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		const members, capacity, workers = 5, 3, 48
		names := []string{"m0", "m1", "m2", "m3", "m4"}
		s := mk(pool.StoreOptions{MaxLeasesPerMember: capacity}, names...)
		var (
			mu      sync.Mutex
			granted []pool.Lease
			refused int
			wg      sync.WaitGroup
		)
		for range workers {
			wg.Go(func() {
				l, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "site.com"})
				mu.Lock()
				defer mu.Unlock()
				var nm *pool.NoMatchError
				switch {
				case err == nil:
					granted = append(granted, l)
				case errors.As(err, &nm):
					refused++
				default:
					t.Errorf("acquire: %v", err)
				}
			})
		}
		wg.Wait()
		if len(granted) != members*capacity || refused != workers-members*capacity {
			t.Fatalf("granted %d refused %d, want %d and %d", len(granted), refused, members*capacity, workers-members*capacity)
		}
		per := map[string]int{}
		for _, l := range granted {
			per[l.Member.Name]++
		}
		for _, m := range s.Members() {
			if per[m.Name] != capacity || m.ActiveLeases != capacity {
				t.Fatalf("%s: %d leases granted, %d active, want %d", m.Name, per[m.Name], m.ActiveLeases, capacity)
			}
		}
		if n := s.ActiveLeases(); n != len(granted) {
			t.Fatalf("ActiveLeases %d, want %d", n, len(granted))
		}
		for _, l := range granted {
			wg.Go(func() { cRelease(t, s, l.ID) })
		}
		wg.Wait()
		if n := s.ActiveLeases(); n != 0 {
			t.Fatalf("ActiveLeases after releasing all = %d", n)
		}
	})
}

func TestStoreContractLeaseExpiryAndFencedRelease(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		s := mk(pool.StoreOptions{}, "a")
		before := time.Now()
		short := cAcquire(t, s, pool.AcquireRequest{TTL: 300 * time.Millisecond})
		after := time.Now()
		long := cAcquire(t, s, pool.AcquireRequest{TTL: time.Minute})
		// The TTL runs from the store's clock during the call (to the
		// millisecond), not from whenever this line runs on a busy machine.
		if d := short.ExpiresAt.Sub(before); d < 299*time.Millisecond || short.ExpiresAt.Sub(after) > 300*time.Millisecond {
			t.Fatalf("short lease expires %v after the call began (%v long)", d, after.Sub(before))
		}
		poll.Until(t, 10*time.Second, "the short lease to expire", func() error {
			if n := memberStatus(t, s, "a").ActiveLeases; n != 1 {
				return fmt.Errorf("active %d, want 1 once the short lease expired", n)
			}
			return nil
		})
		// Releasing the expired lease (twice) must not count it down again.
		cRelease(t, s, short.ID)
		cRelease(t, s, short.ID)
		if n := memberStatus(t, s, "a").ActiveLeases; n != 1 {
			t.Fatalf("active %d after releasing an expired lease, want 1 (the long one)", n)
		}
		cRelease(t, s, long.ID)
		cRelease(t, s, long.ID)
		if n := memberStatus(t, s, "a").ActiveLeases; n != 0 {
			t.Fatalf("active %d after releasing everything", n)
		}
		cRelease(t, s, "never-granted")
	})
}

func TestStoreContractCooldownBackoffAndRetryAfter(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		pol := rotation.CooldownPolicy{Default: 600 * time.Millisecond, Max: 5 * time.Second}
		s := mk(pool.StoreOptions{Cooldown: pol}, "a", "b")
		l := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "site.com"})
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		wantWindow(t, "first ban", cooldownLeft(t, s, "a", "site.com"), 600*time.Millisecond)
		// Cooling for site.com only.
		if got := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"}); got.Member.Name != "b" {
			t.Fatalf("site.com leased %s while a cools down", got.Member.Name)
		}
		if _, err := s.Acquire(context.Background(), pool.AcquireRequest{Proxy: "a", Target: "other.com"}); err != nil {
			t.Fatalf("a for other.com: %v", err)
		}
		// A ban inside the window adds no strike.
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultRateLimited})
		wantWindow(t, "ban inside the window", cooldownLeft(t, s, "a", "site.com"), 600*time.Millisecond)
		waitNoCooldown(t, s, "a", "site.com")
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		wantWindow(t, "second strike doubles", cooldownLeft(t, s, "a", "site.com"), 1200*time.Millisecond)
		// ok resets the strikes but keeps the running window.
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultOK})
		if left := cooldownLeft(t, s, "a", "site.com"); left <= 0 {
			t.Fatal("ok ended the running window")
		}
		waitNoCooldown(t, s, "a", "site.com")
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		wantWindow(t, "ban after ok starts from the base", cooldownLeft(t, s, "a", "site.com"), 600*time.Millisecond)
		// Retry-After sets the base; capped at Max.
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultRateLimited, Target: "ra.com", RetryAfter: 2 * time.Second})
		wantWindow(t, "retry-after", cooldownLeft(t, s, "a", "ra.com"), 2*time.Second)
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultRateLimited, Target: "cap.com", RetryAfter: time.Hour})
		wantWindow(t, "retry-after above the cap", cooldownLeft(t, s, "a", "cap.com"), 5*time.Second)
		if n := s.ActiveCooldowns(); n != 3 {
			t.Fatalf("ActiveCooldowns %d, want 3 (site.com, ra.com, cap.com)", n)
		}
	})
}

// A refusal says when the first member is back only when that is known:
// every member considered rests for the target. An unhealthy member, or
// one at capacity, may be back at any moment, so then it says nothing.
func TestStoreContractRefusalSaysWhenTheFirstMemberIsBack(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}, MaxLeasesPerMember: 1}
		s := mk(o, "a", "b", "c")
		for _, name := range []string{"a", "b"} {
			l := cAcquire(t, s, pool.AcquireRequest{Proxy: name, Target: "x.com"})
			r := pool.Report{Result: rotation.ResultRateLimited, RetryAfter: 30 * time.Second}
			if name == "b" {
				r.RetryAfter = 0 // the default minute
			}
			cReport(t, s, l.ID, r)
			cRelease(t, s, l.ID)
		}
		held := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "y.com"})
		_, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "x.com"})
		if nm := noMatch(t, err); nm.InCooldown != 2 || nm.AtCapacity != 1 || nm.RetryAfterSeconds != 0 {
			t.Fatalf("c at capacity: %+v, want no retry-after (c may be released any moment)", nm)
		}
		cRelease(t, s, held.ID)
		s.SetHealth("c", false, 0)
		_, err = s.Acquire(context.Background(), pool.AcquireRequest{Target: "x.com"})
		if nm := noMatch(t, err); nm.Unhealthy != 1 || nm.RetryAfterSeconds != 0 {
			t.Fatalf("c unhealthy: %+v, want no retry-after", nm)
		}
		// Without c, every member considered rests: the first is back
		// when a's 30s end.
		s.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b")})
		_, err = s.Acquire(context.Background(), pool.AcquireRequest{Target: "x.com"})
		if nm := noMatch(t, err); nm.Considered != 2 || nm.InCooldown != 2 || nm.RetryAfterSeconds < 25 || nm.RetryAfterSeconds > 30 {
			t.Fatalf("a and b resting: %+v, want a back within 30s", nm)
		}
	})
}

func TestStoreContractReportTargetFallbackAndGlobalWindows(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}, FailureWindow: 700 * time.Millisecond}
		s := mk(o, "a", "b")
		l := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "lease.com"})
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned, Target: "report.com"})
		cs := memberStatus(t, s, "a").Cooldowns
		if _, ok := cs["lease.com"]; !ok || len(cs) != 2 {
			t.Fatalf("cooldowns %v, want lease.com (the lease's target) and report.com", cs)
		}
		if _, ok := cs["report.com"]; !ok {
			t.Fatalf("cooldowns %v, want report.com", cs)
		}
		// A lease without a target, reported without one: every target.
		nl := cAcquire(t, s, pool.AcquireRequest{Proxy: "b"})
		cReport(t, s, nl.ID, pool.Report{Result: rotation.ResultBanned})
		if _, ok := memberStatus(t, s, "b").Cooldowns[""]; !ok {
			t.Fatalf("b cooldowns %v, want the every-target one", memberStatus(t, s, "b").Cooldowns)
		}
		_, err := s.Acquire(context.Background(), pool.AcquireRequest{Proxy: "b", Target: "any.com"})
		if nm := noMatch(t, err); nm.InCooldown != 1 {
			t.Fatalf("b after a target-less ban: %+v", nm)
		}
		// upstream_failed takes a out for every target for FailureWindow, then it returns.
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
		wantWindow(t, "failure window", cooldownLeft(t, s, "a", ""), 700*time.Millisecond)
		// b is banned for every target and a rests for its own failure: a
		// is leased anyway (rotation.FailureRest's override), marked; b never.
		if ol := cAcquire(t, s, pool.AcquireRequest{Target: "fresh.com"}); ol.Member.Name != "a" || !ol.FailureRest {
			t.Fatalf("both out: leased %s (FailureRest %v), want a as an override", ol.Member.Name, ol.FailureRest)
		}
		poll.Until(t, 10*time.Second, "a lease on a once cooling member", func() error {
			l, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "fresh.com"})
			if err != nil {
				return err
			}
			if l.Member.Name != "a" || l.FailureRest {
				return fmt.Errorf("leased %s (FailureRest %v)", l.Member.Name, l.FailureRest)
			}
			return nil
		})
	})
}

func TestStoreContractTargetUnreachableRestsThePairAndKeepsStrikes(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: 500 * time.Millisecond, Max: 10 * time.Second}, SiteFailureRest: 400 * time.Millisecond}
		s := mk(o, "a")
		l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"})
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		waitNoCooldown(t, s, "a", "site.com")
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultTargetUnreachable})
		wantWindow(t, "site-failure rest", cooldownLeft(t, s, "a", "site.com"), 400*time.Millisecond)
		if _, err := s.Acquire(context.Background(), pool.AcquireRequest{Target: "other.com"}); err != nil {
			t.Fatalf("target_unreachable took a out for another site: %v", err)
		}
		waitNoCooldown(t, s, "a", "site.com")
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned})
		wantWindow(t, "ban after the rest is strike 2", cooldownLeft(t, s, "a", "site.com"), time.Second)
	})
}

func TestStoreContractLateReportsAndIdempotency(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: 300 * time.Millisecond, Max: 800 * time.Millisecond}}
		s := mk(o, "a", "b")
		l := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
		again := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
		if again.ID != l.ID || again.Member.Name != l.Member.Name {
			t.Fatalf("same idempotency key: lease %s on %s, then %s on %s", l.ID, l.Member.Name, again.ID, again.Member.Name)
		}
		if n := s.ActiveLeases(); n != 1 {
			t.Fatalf("ActiveLeases %d after a repeated acquire, want 1", n)
		}
		if other := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k2"}); other.ID == l.ID {
			t.Fatal("another key got the same lease")
		}
		cRelease(t, s, l.ID)
		cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned}) // late: after release, inside the window
		if cooldownLeft(t, s, l.Member.Name, "site.com") <= 0 {
			t.Fatal("a late report after release cooled nothing down")
		}
		if err := s.Report(context.Background(), "no-such-lease", pool.Report{Result: rotation.ResultOK}); !errors.Is(err, pool.ErrUnknownLease) {
			t.Fatalf("report on an unknown lease: %v", err)
		}
		if err := s.Report(context.Background(), l.ID, pool.Report{Result: "meh"}); !errors.Is(err, pool.ErrInvalidResult) {
			t.Fatalf("invalid result: %v", err)
		}
		poll.Until(t, 10*time.Second, "the released lease to be forgotten", func() error {
			if err := s.Report(context.Background(), l.ID, pool.Report{Result: rotation.ResultOK}); !errors.Is(err, pool.ErrUnknownLease) {
				return fmt.Errorf("report %v after Cooldown.Max past the release, want pool.ErrUnknownLease", err)
			}
			return nil
		})
		if _, err := s.Acquire(context.Background(), pool.AcquireRequest{TTL: 2 * time.Hour}); !errors.Is(err, pool.ErrTTLTooLong) {
			t.Fatalf("TTL above the maximum: %v", err)
		}
	})
}

// TestStoreContractOnlyTheMostRecentReleasedLeasesStayReportable pins the
// bound on what late reports keep alive: of the released leases the
// ReleasedRetained most recently released stay reportable (a gateway
// rotating per request releases one per request, and an hour of those
// would be most of a store), while a lease that ends by its TTL stays
// reportable for the whole report window.
func TestStoreContractOnlyTheMostRecentReleasedLeasesStayReportable(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		// One member: on a Redis store with member groups the bound is per
		// group, and every lease here is in a's.
		s := mk(pool.StoreOptions{ReleasedRetained: 2, Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}}, "a")
		short := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", TTL: 200 * time.Millisecond})
		var ls []pool.Lease
		for range 3 {
			ls = append(ls, cAcquire(t, s, pool.AcquireRequest{Target: "site.com"}))
		}
		for _, l := range ls {
			cRelease(t, s, l.ID)
		}
		if err := s.Report(context.Background(), ls[0].ID, pool.Report{Result: rotation.ResultOK}); !errors.Is(err, pool.ErrUnknownLease) {
			t.Fatalf("report on the third most recently released lease (2 retained): %v, want pool.ErrUnknownLease", err)
		}
		for _, l := range ls[1:] {
			cReport(t, s, l.ID, pool.Report{Result: rotation.ResultOK})
		}
		poll.Until(t, 10*time.Second, "the short lease to end by its TTL", func() error {
			if n := s.ActiveLeases(); n != 0 {
				return fmt.Errorf("%d active leases", n)
			}
			return nil
		})
		for range 3 {
			cRelease(t, s, cAcquire(t, s, pool.AcquireRequest{Target: "site.com"}).ID)
		}
		cReport(t, s, short.ID, pool.Report{Result: rotation.ResultBanned}) // ended by time, not released: its window is Cooldown.Max
		if cooldownLeft(t, s, short.Member.Name, "site.com") <= 0 {
			t.Fatal("a report on a lease that ended by its TTL cooled nothing down")
		}
	})
}

// TestStoreContractARetryAfterItsMemberWasReplacedTakesAFreshLease pins
// idempotency against fencing: a retry (same idempotency key) gets the
// first answer while its member is the same upstream, and a fresh lease on
// a current member once that member moved to another endpoint or left,
// never the fenced lease on an upstream that is no longer in the pool.
func TestStoreContractARetryAfterItsMemberWasReplacedTakesAFreshLease(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		s := mk(pool.StoreOptions{}, "a")
		first := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
		s.SetMembers([]pool.Member{proxyMember(t, "a", "tier", "dc")}) // same endpoint: same upstream
		if again := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"}); again.ID != first.ID {
			t.Fatalf("a retry after a reload that kept the endpoint got lease %s, want the first, %s", again.ID, first.ID)
		}
		moved := proxyMember(t, "a")
		moved.URL = &url.URL{Scheme: "http", Host: "127.0.0.1:3129"}
		s.SetMembers([]pool.Member{moved})
		again := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"})
		if again.ID == first.ID || again.Member.URL.Host != "127.0.0.1:3129" {
			t.Fatalf("a retry after a moved to another endpoint got lease %s on %v, want a fresh one on :3129 (first %s)", again.ID, again.Member.URL, first.ID)
		}
		if a := memberStatus(t, s, "a"); a.ActiveLeases != 1 {
			t.Fatalf("the new a holds %d leases, want 1 (the retry's)", a.ActiveLeases)
		}
		if third := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"}); third.ID != again.ID {
			t.Fatalf("the next retry got %s, want the fresh lease %s", third.ID, again.ID)
		}
		s.SetMembers([]pool.Member{proxyMember(t, "b")})
		if gone := cAcquire(t, s, pool.AcquireRequest{Target: "site.com", IdempotencyKey: "k1"}); gone.Member.Name != "b" {
			t.Fatalf("a retry after its member left got a lease on %s, want one on b", gone.Member.Name)
		}
	})
}

func TestStoreContractReloadKeepsStateUnlessTheEndpointChanges(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		s := mk(pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}}, "a", "b")
		la := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "site.com"})
		lb := cAcquire(t, s, pool.AcquireRequest{Proxy: "b", Target: "site.com"})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultBanned})
		cReport(t, s, lb.ID, pool.Report{Result: rotation.ResultBanned})
		// a keeps its endpoint and gains an attribute; b moves to a new port.
		moved := proxyMember(t, "b")
		moved.URL = &url.URL{Scheme: "http", Host: "127.0.0.1:3129"}
		s.SetMembers([]pool.Member{proxyMember(t, "a", "tier", "dc"), moved, proxyMember(t, "c")})
		if left := cooldownLeft(t, s, "a", "site.com"); left <= 0 {
			t.Fatal("a kept its endpoint but lost its cooldown")
		}
		if a := memberStatus(t, s, "a"); a.ActiveLeases != 1 || a.Attributes["tier"] != "dc" {
			t.Fatalf("a after reload: %+v", a)
		}
		if b := memberStatus(t, s, "b"); len(b.Cooldowns) != 0 || b.ActiveLeases != 0 {
			t.Fatalf("b has a new endpoint (a new upstream) but kept %+v", b)
		}
		// The old b's lease still releases and reports without touching the new b.
		cReport(t, s, lb.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
		cRelease(t, s, lb.ID)
		if b := memberStatus(t, s, "b"); len(b.Cooldowns) != 0 || b.ActiveLeases != 0 {
			t.Fatalf("a report on the old b's lease reached the new b: %+v", b)
		}
		if l := cAcquire(t, s, pool.AcquireRequest{Selector: map[string]string{"tier": "dc"}}); l.Member.Name != "a" {
			t.Fatalf("tier=dc leased %s", l.Member.Name)
		}
		s.SetMembers([]pool.Member{proxyMember(t, "c")})
		if ms := s.Members(); len(ms) != 1 || ms[0].Name != "c" {
			t.Fatalf("members after removing a and b: %v", ms)
		}
		cRelease(t, s, la.ID) // a removed member's lease is still releasable
		if n := s.ActiveLeases(); n != 1 {
			t.Fatalf("ActiveLeases %d, want 1 (the tier=dc lease on removed a)", n)
		}
	})
}

// TestStoreContractListCooldownsSaysWhyEachRuns pins the status pages' read:
// every running cooldown of a current member, sorted by site then member,
// with the result that set its current end; ended windows and removed
// members are not listed, and an ok report keeps the reason of the window it
// leaves running.
func TestStoreContractListCooldownsSaysWhyEachRuns(t *testing.T) {
	runContract(t, func(t *testing.T, mk func(pool.StoreOptions, ...string) pool.LeaseStore) {
		o := pool.StoreOptions{
			Cooldown:        rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour},
			FailureWindow:   time.Minute,
			SiteFailureRest: 300 * time.Millisecond,
		}
		s := mk(o, "a", "b", "c")
		la := cAcquire(t, s, pool.AcquireRequest{Proxy: "a", Target: "shop.com"})
		lb := cAcquire(t, s, pool.AcquireRequest{Proxy: "b", Target: "shop.com"})
		lc := cAcquire(t, s, pool.AcquireRequest{Proxy: "c", Target: "news.com"})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultRateLimited, RetryAfter: 30 * time.Second})
		cReport(t, s, lb.ID, pool.Report{Result: rotation.ResultBanned})
		cReport(t, s, lb.ID, pool.Report{Result: rotation.ResultOK})
		cReport(t, s, lc.ID, pool.Report{Result: rotation.ResultUpstreamFailed})
		cReport(t, s, la.ID, pool.Report{Result: rotation.ResultTargetUnreachable, Target: "dead.com"})

		type row struct{ member, target, reason string }
		list := func() []row {
			t.Helper()
			// The store decides what still runs by its own clock, during
			// the call: a window it lists ends after the call began, and
			// may have ended by the time the call returns.
			before := time.Now()
			cs, err := s.ListCooldowns(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			var out []row
			for _, c := range cs {
				if !c.Until.After(before) || c.Until.After(after.Add(time.Minute+time.Second)) {
					t.Fatalf("%+v: until is %v after the call began", c, c.Until.Sub(before))
				}
				out = append(out, row{c.Member, c.Target, string(c.Reason)})
			}
			return out
		}
		want := []row{
			{"c", "", "upstream_failed"},
			{"a", "dead.com", "target_unreachable"},
			{"a", "shop.com", "rate_limited"},
			{"b", "shop.com", "banned"},
		}
		if got := list(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("cooldowns\n got %v\nwant %v", got, want)
		}
		poll.Until(t, 10*time.Second, "the dead.com rest to end", func() error {
			if got := list(); len(got) != 3 {
				return fmt.Errorf("the dead.com rest has not ended: %v", got)
			}
			return nil
		})
		s.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b")})
		if got := list(); fmt.Sprint(got) != fmt.Sprint(want[2:]) {
			t.Fatalf("after c left: %v, want %v", got, want[2:])
		}
	})
}
