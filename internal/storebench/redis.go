package storebench

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/pool"
)

// RedisInfo is a redis-server the Redis figures read (internal/testkit/redis.Server).
type RedisInfo interface {
	Info(section string) (map[string]string, error)
	Do(args ...string) (any, error)
}

// MixedRequests are the mixed workload's acquires: half with a selector,
// alternating between Selector and tier=dc.
func MixedRequests() []pool.AcquireRequest {
	reqs := []pool.AcquireRequest{Request(false), Request(true), Request(false), Request(false)}
	reqs[3].Selector = map[string]string{"tier": "dc"}
	return reqs
}

// RedisCPU is the server's own CPU time so far (user + system, INFO cpu),
// in seconds.
func RedisCPU(r RedisInfo) (float64, error) {
	info, err := r.Info("cpu")
	if err != nil {
		return 0, err
	}
	u, err := strconv.ParseFloat(info["used_cpu_user"], 64)
	if err != nil {
		return 0, err
	}
	s, err := strconv.ParseFloat(info["used_cpu_sys"], 64)
	return u + s, err
}

// statSum sums one field of INFO commandstats over the commands keep accepts.
func statSum(r RedisInfo, field string, keep func(cmd string) bool) (float64, error) {
	info, err := r.Info("commandstats")
	if err != nil {
		return 0, err
	}
	total := 0.0
	for k, v := range info {
		if !keep(strings.TrimPrefix(k, "cmdstat_")) {
			continue
		}
		for f := range strings.SplitSeq(v, ",") {
			if n, ok := strings.CutPrefix(f, field+"="); ok {
				x, _ := strconv.ParseFloat(n, 64)
				total += x
			}
		}
	}
	return total, nil
}

// ScriptMicros is the time the server spent inside scripts (EVALSHA and
// EVAL) since the last CONFIG RESETSTAT, in µs.
func ScriptMicros(r RedisInfo) (float64, error) {
	return statSum(r, "usec", func(c string) bool { return c == "evalsha" || c == "eval" })
}

// CommandMicros is the time the server spent in the commands scripts
// called (every command but the scripts themselves and the ones a client
// or a test sends to look around) since the last CONFIG RESETSTAT, in µs:
// of ScriptMicros, what is not the Lua interpreter's.
func CommandMicros(r RedisInfo) (float64, error) {
	return statSum(r, "usec", func(c string) bool {
		return c != "evalsha" && c != "eval" && !lookAround(c)
	})
}

// lookAround reports whether c is a command a client or a test sends to
// look around (INFO, CONFIG, CLUSTER, PING, ...), not one of the store's.
func lookAround(c string) bool {
	switch strings.SplitN(c, "|", 2)[0] {
	case "info", "config", "cluster", "ping", "command", "hello", "client", "readonly", "select", "auth":
		return true
	}
	return false
}

// FleetCalls counts the commands the server ran for the store since the
// last CONFIG RESETSTAT: every command but the ones a client or a test
// sends to look around (INFO, CONFIG, CLUSTER, PING, ...).
func FleetCalls(r RedisInfo) (float64, error) {
	return statSum(r, "calls", func(c string) bool { return !lookAround(c) })
}

// RedisCycles runs the mixed workload's acquire+release cycles on s for b
// and reports, besides ns/op (the cycle as the client sees it),
// redis-µs/cycle (the server's whole CPU by INFO cpu), script-µs/cycle
// (the time inside the scripts) and cmd-µs/cycle (of that, the time in the
// commands the scripts called; the rest is Lua's). With later, the cycle is
// the gateway's (LaterCycle); the last release is sent before the figures
// are read.
func RedisCycles(b *testing.B, s pool.Pool, r RedisInfo, later bool) {
	ctx := context.Background()
	reqs := MixedRequests()
	lr, _ := s.(pool.LaterReleaser)
	if later && lr == nil {
		b.Fatalf("%T cannot release later", s)
	}
	if _, err := r.Do("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	cpu0, err := RedisCPU(r)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		req := reqs[i%len(reqs)]
		i++
		var err error
		if later {
			err = LaterCycle(ctx, s, lr, req)
		} else {
			err = Cycle(ctx, s, req)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if later {
		if err := FlushLater(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	cpu1, err := RedisCPU(r)
	if err != nil {
		b.Fatal(err)
	}
	us, err := ScriptMicros(r)
	if err != nil {
		b.Fatal(err)
	}
	cmds, err := CommandMicros(r)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((cpu1-cpu0)/float64(b.N)*1e6, "redis-µs/cycle")
	b.ReportMetric(us/float64(b.N), "script-µs/cycle")
	b.ReportMetric(cmds/float64(b.N), "cmd-µs/cycle")
}

// Primaries are the nodes whose INFO replication says role:master.
func Primaries[T RedisInfo](nodes []T) []T {
	var out []T
	for _, n := range nodes {
		if info, err := n.Info("replication"); err == nil && info["role"] == "master" {
			out = append(out, n)
		}
	}
	return out
}

// CommandShares runs run and returns each server's share, in percent, of
// the store's commands (FleetCalls) all of them ran meanwhile.
func CommandShares[T RedisInfo](servers []T, run func() error) ([]float64, error) {
	calls := func() ([]float64, error) {
		out := make([]float64, len(servers))
		for i, sv := range servers {
			n, err := FleetCalls(sv)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	}
	before, err := calls()
	if err != nil {
		return nil, err
	}
	if err := run(); err != nil {
		return nil, err
	}
	after, err := calls()
	if err != nil {
		return nil, err
	}
	total := 0.0
	for i := range after {
		after[i] -= before[i]
		total += after[i]
	}
	for i := range after {
		after[i] = 100 * after[i] / max(total, 1)
	}
	return after, nil
}

// MixedCycles runs n of the mixed workload's acquire+release cycles on s.
func MixedCycles(ctx context.Context, s pool.Pool, n int) error {
	reqs := MixedRequests()
	for i := range n {
		if err := Cycle(ctx, s, reqs[i%len(reqs)]); err != nil {
			return err
		}
	}
	return nil
}

// RedisRoundTrips runs call (one round trip to r) for b and reports
// redis-µs/op, the server's own CPU per call: with a call that runs a
// script writing one key, the least any store operation costs the server
// on this machine, the floor the cycle's figure is read against.
func RedisRoundTrips(b *testing.B, r RedisInfo, call func() error) {
	if err := call(); err != nil { // loads the script
		b.Fatal(err)
	}
	cpu0, err := RedisCPU(r)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, err := RedisCPU(r)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((cpu1-cpu0)/float64(b.N)*1e6, "redis-µs/op")
}
