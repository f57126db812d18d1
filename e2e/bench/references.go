package main

import (
	"fmt"
	"net"
	"os"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// reference is a minimal proxy the bench measures beside the gateway, in
// front of the same Squid and exactly as the gateway is measured, to say
// what a design costs with everything but its bones taken out. Each runs
// as this bench binary started with its environment variable set.
type reference struct {
	// name labels its rows; what says what it is in the progress lines.
	name, what string
	// env holds "LISTEN-ADDR UPSTREAM-ADDR" when the binary runs as it.
	env string
	// run serves on listen, forwarding to upstream, until it fails.
	run func(listen, upstream string) error
}

// runReference runs the bench binary as ref, its environment variable
// holding spec ("LISTEN-ADDR UPSTREAM-ADDR").
func runReference(ref reference, spec string) error {
	var listen, upstream string
	if _, err := fmt.Sscan(spec, &listen, &upstream); err != nil {
		return fmt.Errorf("%s=%q: want \"LISTEN UPSTREAM\"", ref.env, spec)
	}
	return ref.run(listen, upstream)
}

// serveEach accepts on listen until that fails, each connection handled
// by handle on a goroutine of its own.
func serveEach(listen string, handle func(net.Conn)) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c)
	}
}

// references are measured in this order, each for plain keep-alive
// requests and for new CONNECT tunnels.
var references = []reference{
	{name: "relay", what: "do-nothing relay (accept, dial Squid, splice both ways; nothing parsed)", env: relayEnv, run: runRelay},
	{name: "floor", what: "floor proxy (a goroutine per connection, nothing but the system calls)", env: floorEnv, run: runFloorProxy},
	{name: "epoll", what: "epoll relay (one thread, its own epoll loop off Go's netpoller)", env: epollFloorEnv, run: runEpollFloor},
	{name: "fasthttp", what: "fasthttp proxy (fasthttp's Server as the front end)", env: fasthttpFloorEnv, run: runFasthttpFloor},
}

// runningReference is a started reference proxy.
type runningReference struct {
	reference
	proc *testutil.Process
	addr string
}

// path is the way to Squid through this reference, its CPU counted where
// the gateway's would be.
func (r runningReference) path() benchPath {
	return benchPath{name: r.name, proxy: "http://" + r.addr, pid: r.proc.PID()}
}

// paths is the single hop against the path through this reference.
func (r runningReference) paths(direct benchPath) []benchPath {
	return []benchPath{direct, r.path()}
}

// rows are its CPU per unit ("request", "tunnel") against Squid's and the
// throughput ratio that CPU implies.
func (r runningReference) rows(unit string, res []tpResult, ratio string) []row {
	return []row{
		{metric: fmt.Sprintf("  %s CPU per %s vs Squid (reference)", r.name, unit), chain: us(res[1].gatewayCPU), direct: us(res[0].squidCPU),
			figure: fmt.Sprintf("%.2f×", float64(res[1].gatewayCPU)/float64(res[0].squidCPU)), ok: true},
		{metric: fmt.Sprintf("  %s: %s ratio implied by CPU (reference)", r.name, ratio),
			figure: fmt.Sprintf("%.2f×", cpuBound(res[0], res[1])), ok: true},
	}
}

type runningReferences []runningReference

// startReferences starts every reference in front of upstream; on an
// error the ones started are in the result, for stop.
func startReferences(upstream string) (runningReferences, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out runningReferences
	for _, ref := range references {
		p, addrs, err := testutil.LaunchProcessOnFreePorts(self, 1, func(addrs []string) testutil.ProcessOptions {
			return testutil.ProcessOptions{
				Name:      ref.name + "-proxy",
				Env:       []string{ref.env + "=" + addrs[0] + " " + upstream},
				WaitAddrs: addrs,
			}
		})
		if err != nil {
			return out, fmt.Errorf("start the %s proxy: %w", ref.name, err)
		}
		out = append(out, runningReference{reference: ref, proc: p, addr: addrs[0]})
	}
	return out, nil
}

func (rs runningReferences) stop() {
	for _, r := range rs {
		_, _ = r.proc.Stop()
	}
}

// named is the reference called name (references always holds it).
func (rs runningReferences) named(name string) runningReference {
	for _, r := range rs {
		if r.name == name {
			return r
		}
	}
	panic("bench: no reference " + name)
}
