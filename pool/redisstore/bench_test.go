package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// redisCPU is the server's own CPU time so far (user + system), in seconds.
func redisCPU(b *testing.B, r *testutil.Redis) float64 {
	b.Helper()
	info, err := r.Info("cpu")
	if err != nil {
		b.Fatal(err)
	}
	u, err1 := strconv.ParseFloat(info["used_cpu_user"], 64)
	s, err2 := strconv.ParseFloat(info["used_cpu_sys"], 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("INFO cpu: %v", info)
	}
	return u + s
}

// scriptUsec is the time redis-server spent inside scripts (EVALSHA and
// EVAL, by INFO commandstats) since the last CONFIG RESETSTAT, in µs: the
// scripts' own cost, without the event loop, the AOF and other work a
// loaded machine adds to INFO cpu.
func scriptUsec(b *testing.B, r *testutil.Redis) float64 {
	b.Helper()
	info, err := r.Info("commandstats")
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, k := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		for f := range strings.SplitSeq(info[k], ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}

// benchRequests is the mixed workload's acquires: half with a selector.
func benchRequests() []pool.AcquireRequest {
	reqs := []pool.AcquireRequest{storebench.Request(false), storebench.Request(true), storebench.Request(false), storebench.Request(false)}
	reqs[3].Selector = map[string]string{"tier": "dc"}
	return reqs
}

// BenchmarkRedisStoreAcquireRelease is one caller's acquire+release cycles
// through the RedisStore's public API against a redis-server of its own
// (loopback, AOF with appendfsync everysec), at storebench.Sizes members,
// half the acquires with a selector (storebench's mixed workload). Besides
// ns/op (the cycle as the client sees it, round trips included) it reports
// redis-µs/cycle, the server's own CPU per cycle from INFO cpu, and
// script-µs/cycle, the time inside the two scripts by INFO commandstats.
//
//	go test -run x -bench BenchmarkRedisStoreAcquireRelease -benchtime 3s ./pool/redisstore/
func BenchmarkRedisStoreAcquireRelease(b *testing.B) {
	r := testutil.StartRedis(b, testutil.RedisOptions{AppendFsync: "everysec"})
	for _, n := range storebench.Sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			s, err := NewRedisStore(RedisOptions{URL: r.URL(), Prefix: fmt.Sprintf("bench%d", n)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.SetMembersHealth(storebench.Members(n))
			ctx := context.Background()
			reqs := benchRequests()
			if _, err := r.Do("CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, r)
			i := 0
			for b.Loop() {
				l, err := s.Acquire(ctx, reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Release(ctx, l.ID); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric((redisCPU(b, r)-cpu0)/float64(b.N)*1e6, "redis-µs/cycle")
			b.ReportMetric(scriptUsec(b, r)/float64(b.N), "script-µs/cycle")
		})
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
	r := testutil.StartRedis(b, testutil.RedisOptions{AppendFsync: "everysec"})
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
