package gateway

import (
	"math"
	"testing"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// allocBudget pins the allocations of one op of a request benchmark, the
// whole process counted (client, gateway and loopback target, as
// `-benchmem` counts them). The budget is allocSlack above the count
// measured when it was set, so only a real regression fails, never the
// noise of a busy machine (allocation counts do not move with load). The
// race detector's build allocates more (its sync.Pool drops a quarter of
// what it is given), so it has counts of its own.
type allocBudget struct {
	name      string
	bench     string  // -bench for the benchmark that runs the same op
	today     float64 // allocs/op when the budget was set
	todayRace float64 // the same under -race
	setup     func(testing.TB) func(testing.TB)
}

// allocSlack is how far above its measured count a budget lies.
const allocSlack = 1.27

func (ab allocBudget) budget() (today, budget float64) {
	today = ab.today
	if raceBuild {
		today = ab.todayRace
	}
	return today, math.Floor(today * allocSlack)
}

var allocBudgets = []allocBudget{
	{
		name: "plain request, sticky", bench: `^BenchmarkPlainHTTP$/^sticky$`,
		today: 149, todayRace: 160,
		setup: plainOp(rotation.ModeSticky),
	},
	{
		name: "plain request, per-request rotation", bench: `^BenchmarkPlainHTTP$/^request$`,
		today: 150, todayRace: 162,
		setup: plainOp(rotation.ModeRequest),
	},
	{
		// Both gateways' allocations count: the outer one's lean path and
		// the upstream gateway's direct member.
		name: "plain request through an http:// upstream (the lean path)", bench: `^BenchmarkPlainHTTPThroughUpstream$`,
		today: 200, todayRace: 213,
		setup: func(tb testing.TB) func(testing.TB) {
			c, target := throughUpstream(tb)
			return func(tb testing.TB) { getOnce(tb, c, target) }
		},
	},
	{
		name: "new CONNECT tunnel", bench: `^BenchmarkConnectTunnel$`,
		today: 108, todayRace: 109,
		setup: func(tb testing.TB) func(testing.TB) {
			echo := echoServer(tb)
			gw := benchGateway(tb, rotation.ModeSticky)
			return func(tb testing.TB) { tunnelOnce(tb, gw, echo) }
		},
	},
	{
		name: "MITM'd request on a kept tunnel", bench: `^BenchmarkMITMRequest$`,
		today: 124, todayRace: 135,
		setup: func(tb testing.TB) func(testing.TB) {
			c, u := mitmBench(tb, FingerprintMirror)
			return func(tb testing.TB) { getOnce(tb, c, u) }
		},
	},
}

func plainOp(mode rotation.Mode) func(testing.TB) func(testing.TB) {
	return func(tb testing.TB) func(testing.TB) {
		target := benchTarget(tb)
		c := benchClient(benchGateway(tb, mode))
		tb.Cleanup(c.CloseIdleConnections)
		return func(tb testing.TB) { getOnce(tb, c, target) }
	}
}

// TestAllocationBudgets pins the allocations per request of the request
// benchmarks' own ops over real loopback servers: a change that makes the
// hot path allocate markedly more fails here, in the unit tests, rather
// than waiting for someone to run the benchmarks. It counts, never times.
func TestAllocationBudgets(t *testing.T) {
	for _, ab := range allocBudgets {
		t.Run(ab.name, func(t *testing.T) {
			op := ab.setup(t)
			for range 20 { // warm: connections, pools, code paths
				op(t)
			}
			got := testing.AllocsPerRun(300, func() { op(t) })
			today, budget := ab.budget()
			t.Logf("%s: %.0f allocs/op (budget %.0f, %.0f when it was set; race build %v)", ab.name, got, budget, today, raceBuild)
			if got > budget {
				t.Errorf("%s: %.0f allocations per op, over the budget of %.0f (%.0f when it was set). "+
					"Re-measure with `go test -run '^$' -bench '%s' -benchmem ./gateway` (allocs/op); "+
					"if the rise is meant, set the new count (today, or todayRace for -race) in gateway/allocs_test.go "+
					"and docs/performance.md", ab.name, got, budget, today, ab.bench)
			}
		})
	}
}
