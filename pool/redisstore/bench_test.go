package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// scriptUsec is storebench.ScriptMicros, failing b on an error.
func scriptUsec(b *testing.B, r *redis.Server) float64 {
	b.Helper()
	us, err := storebench.ScriptMicros(r)
	if err != nil {
		b.Fatal(err)
	}
	return us
}

// BenchmarkRedisStoreAcquireRelease is one caller's acquire+release cycles
// through the RedisStore's public API against a redis-server of its own
// (loopback, AOF with appendfsync everysec), at storebench.Sizes members,
// half the acquires with a selector (storebench's mixed workload). Besides
// ns/op (the cycle as the client sees it, round trips included) it reports
// redis-µs/cycle, the server's own CPU per cycle from INFO cpu, and
// script-µs/cycle, the time inside the scripts by INFO commandstats.
// release=sync waits for each release (Release, as the lease API's DELETE
// does: two round trips a cycle); release=later is the gateway's cycle
// (ReleaseLater: the release goes with the next acquire, one round trip).
//
//	go test -run x -bench BenchmarkRedisStoreAcquireRelease -benchtime 3s ./pool/redisstore/
func BenchmarkRedisStoreAcquireRelease(b *testing.B) {
	r := redis.Start(b, redis.Options{AppendFsync: "everysec"})
	for _, n := range storebench.Sizes {
		for _, later := range []bool{false, true} {
			name := map[bool]string{false: "sync", true: "later"}[later]
			b.Run(fmt.Sprintf("members=%d/release=%s", n, name), func(b *testing.B) {
				s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: fmt.Sprintf("bench%d%s", n, name)})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				s.SetMembersHealth(storebench.Members(n))
				storebench.RedisCycles(b, s, r, later)
			})
		}
	}
}

// BenchmarkRedisStorePace is one pace decision with limits on the Redis
// store, as BenchmarkPacesDecision in pool does on the memory one: a slot
// at a 1µs interval over 100 members of one site, a place in flight taken
// and given back (two decisions), an answer fed to a slowed site. Besides
// ns/op (as the client sees it) it reports script-µs/op, the time inside
// the pace script by INFO commandstats.
//
//	go test -run x -bench BenchmarkRedisStorePace -benchtime 2s ./pool/redisstore/
func BenchmarkRedisStorePace(b *testing.B) {
	r := redis.Start(b, redis.Options{AppendFsync: "everysec"})
	s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "benchpace"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	members := make([]string, 100)
	for i := range members {
		members[i] = "m" + strconv.Itoa(i)
	}
	measure := func(b *testing.B, op func(i int) error) {
		if _, err := r.Do("CONFIG", "RESETSTAT"); err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			if err := op(i); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(scriptUsec(b, r)/float64(b.N), "script-µs/op")
	}
	b.Run("reserve", func(b *testing.B) {
		measure(b, func(i int) error {
			_, err := s.ReserveSlot(ctx, pool.SlotRequest{Site: "example.com", Member: members[i%len(members)], MinInterval: time.Microsecond, Auto: true, MaxWait: time.Hour})
			return err
		})
	})
	b.Run("enter+leave", func(b *testing.B) {
		measure(b, func(int) error {
			if in, err := s.EnterSite(ctx, "example.com", "h", 4); err != nil || !in {
				return fmt.Errorf("enter: %v %v", in, err)
			}
			return s.LeaveSite(ctx, "example.com", "h")
		})
	})
	b.Run("answer", func(b *testing.B) {
		if _, err := s.SiteAnswered(ctx, pool.SiteAnswer{Site: "example.com", Member: "m0", Result: rotation.ResultBanned}); err != nil {
			b.Fatal(err)
		}
		measure(b, func(int) error {
			l, err := s.SiteAnswered(ctx, pool.SiteAnswer{Site: "example.com", Member: "m1", Result: rotation.ResultOK, SeenCuts: 1})
			if err == nil && !l.Slowed() { // back to unlimited (every ~5000 answers): cut it again
				_, err = s.SiteAnswered(ctx, pool.SiteAnswer{Site: "example.com", Member: "m0", Result: rotation.ResultBanned})
			}
			return err
		})
	})
}

// BenchmarkRedisStoreAcquireHeldSelector is acquires with a selector
// (region=eu, a quarter of the members) that hold their leases, released a
// thousand at a time, at 10,000 members: the state of a fleet whose
// sessions hold leases, where the members a selector does not match crowd
// the front of the choice order. It reports script-µs/cycle (the acquire and its release).
//
//	go test -run x -bench BenchmarkRedisStoreAcquireHeldSelector ./pool/redisstore/
func BenchmarkRedisStoreAcquireHeldSelector(b *testing.B) {
	r := redis.Start(b, redis.Options{AppendFsync: "everysec"})
	s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: "benchheld"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.SetMembersHealth(storebench.Members(10000))
	ctx := context.Background()
	req := storebench.Request(true)
	var held []string
	acquires := 0
	if _, err := r.Do("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		l, err := s.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		acquires++
		if held = append(held, l.ID); len(held) == 1000 {
			for _, id := range held {
				_ = s.Release(ctx, id)
			}
			held = held[:0]
		}
	}
	b.ReportMetric(scriptUsec(b, r)/float64(acquires), "script-µs/cycle")
}
