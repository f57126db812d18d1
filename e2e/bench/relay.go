package main

import (
	"fmt"
	"net"
	"time"
)

// The relay is the physical floor of a proxy hop, the reference the
// gateway's speed goals are ratios of: accept, dial the upstream (Squid),
// and copy both ways with the kernel's splice(2) (Go's TCPConn.ReadFrom
// between two TCP connections), nothing parsed and nothing decided. The
// client speaks to Squid through it as if it were not there: a proxy-form
// request or a CONNECT reaches Squid byte for byte. Any proxy in the
// gateway's place does at least this; the floor proxy (floor.go) adds the
// least parsing a forward proxy needs.

// relayEnv, when set, makes the bench binary run as the relay:
// "LISTEN-ADDR UPSTREAM-ADDR".
const relayEnv = "PROXYFLEET_BENCH_RELAY"

// runRelay serves until killed.
func runRelay(listen, upstream string) error {
	return serveEach(listen, func(c net.Conn) { relayConn(c.(*net.TCPConn), upstream) })
}

// relayConn splices c and a new connection to upstream both ways until
// each side has closed its half.
func relayConn(c *net.TCPConn, upstream string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		return
	}
	up := u.(*net.TCPConn)
	defer up.Close()
	done := make(chan struct{})
	go func() {
		_, _ = up.ReadFrom(c)
		_ = up.CloseWrite()
		close(done)
	}()
	_, _ = c.ReadFrom(up)
	_ = c.CloseWrite()
	<-done
}

// floorGoalRows are the speed goals, ratios of the gateway chain's figures
// (gw) to the relay chain's (rl), both measured in the same rounds: CPU per
// unit at most maxCPU times the relay's, and chain throughput at least
// 0.97 times the relay chain's.
func floorGoalRows(what, unit string, gw, rl tpResult, maxCPU float64) []row {
	cpu := float64(gw.gatewayCPU) / float64(rl.gatewayCPU)
	tp := gw.rps / rl.rps
	return []row{
		{metric: fmt.Sprintf("  %s: gateway CPU per %s ÷ the relay's", what, unit), chain: us(gw.gatewayCPU), direct: us(rl.gatewayCPU) + " (relay)",
			figure: fmt.Sprintf("%.2f×", cpu), target: fmt.Sprintf("≤ %.2f×", maxCPU), ok: cpu <= maxCPU},
		{metric: fmt.Sprintf("  %s: gateway chain req/s ÷ the relay chain's", what), chain: f0(gw.rps), direct: f0(rl.rps) + " (relay)",
			figure: fmt.Sprintf("%.2f×", tp), target: "≥ 0.97×", ok: tp >= 0.97},
	}
}
