package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// The cost model says where a unit of work goes, beside the floor's: the
// system calls a proxy makes per plain request, per new tunnel and per
// MITM'd request (strace -c attached to the running process while a
// sequential client does the work: strace slows the process, so the calls
// that wait, epoll_wait and futex, may come a little differently, the
// others are the work's own), and the allocations of the same units (the gateway's
// pinned request benchmarks, -benchmem). CPU per unit is in the throughput
// rows above.

// costUnits is how many units of work one strace count covers.
const costUnits = 400

// syscallsPer attaches strace -f -c to pid, runs n units of do with one
// client (warmed first, so connections and pools are there) and returns the
// system calls the process made per unit.
func syscallsPer(pid int, c *http.Client, do func(*http.Client) error, n int) (float64, error) {
	for range 20 {
		if err := do(c); err != nil {
			return 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	out, err := os.CreateTemp("", "proxyfleet-bench-strace-")
	if err != nil {
		return 0, err
	}
	out.Close()
	defer os.Remove(out.Name())
	cmd := exec.Command("strace", "-f", "-c", "-o", out.Name(), "-p", strconv.Itoa(pid))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("strace (hack/bench-deps.sh installs it): %w", err)
	}
	// strace says "Process N attached" for every thread it takes: the
	// work starts 300 ms after the first line, the others by then.
	attached := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if strings.Contains(sc.Text(), "attached") && !once {
				once = true
				close(attached)
			}
		}
		if !once {
			close(attached)
		}
	}()
	select {
	case <-attached:
	case <-time.After(10 * time.Second):
	}
	time.Sleep(300 * time.Millisecond) // the other threads' lines
	var workErr error
	for range n {
		if workErr = do(c); workErr != nil {
			break
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	if workErr != nil {
		return 0, workErr
	}
	calls, err := straceTotal(out.Name())
	if err != nil {
		return 0, err
	}
	return float64(calls) / float64(n), nil
}

// straceTotal reads the calls column of strace -c's total line.
func straceTotal(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) >= 5 && f[len(f)-1] == "total" {
			return strconv.ParseInt(f[3], 10, 64)
		}
	}
	return 0, fmt.Errorf("strace -c wrote no total line:\n%s", b)
}

// costRow is one unit's system calls, the gateway's beside the floor's.
func costRow(what string, gw, floor float64, floorName string) row {
	return row{metric: "  system calls per " + what, chain: fmt.Sprintf("%.1f", gw), direct: fmt.Sprintf("%.1f (%s)", floor, floorName),
		figure: fmt.Sprintf("%.2f×", gw/floor), ok: true}
}

// syscallRows are the plain-request and new-tunnel rows of the cost model:
// the gateway (gwPID at gwURL) against the relay (relay).
func syscallRows(gwPID int, gwURL string, relay runningReference, plainURL, tlsURL string, tlsConf *tls.Config) ([]row, error) {
	fmt.Println("cost model: system calls per unit (strace -c) ...")
	var rows []row
	for _, unit := range []struct {
		what, url string
		newConn   bool
		tls       *tls.Config
	}{{"plain keep-alive request", plainURL, false, nil}, {"new tunnel (HTTPS request)", tlsURL, true, tlsConf}} {
		var per [2]float64
		for i, p := range []struct {
			proxy string
			pid   int
		}{{gwURL, gwPID}, {"http://" + relay.addr, relay.proc.PID()}} {
			c, err := benchClient(p.proxy, 1, unit.newConn, unit.tls)
			if err != nil {
				return nil, err
			}
			n, err := syscallsPer(p.pid, c, func(c *http.Client) error { return getOK(c, unit.url) }, costUnits)
			c.CloseIdleConnections()
			if err != nil {
				return nil, fmt.Errorf("cost model, %s: %w", unit.what, err)
			}
			per[i] = n
		}
		rows = append(rows, costRow(unit.what, per[0], per[1], "relay"))
	}
	return rows, nil
}

// allocsRe reads a benchmark line's name and allocs/op.
var allocsRe = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+.*?\s(\d+) allocs/op`)

// allocRows runs the gateway's pinned request benchmarks (the ops
// TestAllocationBudgets holds to a budget) with -benchmem: allocations per
// plain request (through the gateway, and the same client straight to the
// target), per plain request on the lean path (through an http:// upstream,
// as the bench's chain through Squid: the upstream, a second gateway with a
// direct member, counts too), per new tunnel and per MITM'd request, the
// whole process counted.
func allocRows() ([]row, error) {
	fmt.Println("cost model: allocations per unit (go test -bench -benchmem ./gateway) ...")
	root, err := testutil.ModuleRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", `^(BenchmarkPlainHTTP|BenchmarkPlainHTTPBaseline|BenchmarkPlainHTTPThroughUpstream|BenchmarkConnectTunnel|BenchmarkMITMRequest)$`,
		"-benchmem", "-benchtime", "2000x", "./gateway")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench ./gateway: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if m := allocsRe.FindStringSubmatch(line); m != nil {
			got[m[1]] = m[2]
		}
	}
	allocRow := func(what, bench, floorBench, floorName string) row {
		r := row{metric: "  allocations per " + what + " (whole process)", chain: got[bench], ok: true}
		if floorBench != "" {
			r.direct = got[floorBench] + " (" + floorName + ")"
		}
		return r
	}
	if got["BenchmarkPlainHTTP/sticky"] == "" || got["BenchmarkMITMRequest"] == "" {
		return nil, fmt.Errorf("go test -bench ./gateway: no allocs/op in:\n%s", out)
	}
	return []row{
		allocRow("plain request", "BenchmarkPlainHTTP/sticky", "BenchmarkPlainHTTPBaseline", "client to target, no proxy"),
		allocRow("plain request through an http:// upstream (lean path; two gateways)", "BenchmarkPlainHTTPThroughUpstream", "", ""),
		allocRow("new tunnel", "BenchmarkConnectTunnel", "", ""),
		allocRow("MITM'd request", "BenchmarkMITMRequest", "", ""),
	}, nil
}

// headOrderRe reads a BenchmarkHeadOrder line: the side, ns/op, allocs/op.
var headOrderRe = regexp.MustCompile(`^BenchmarkHeadOrder/(go|client)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op\s+\d+ B/op\s+(\d+) allocs/op`)

// headOrderRows runs BenchmarkHeadOrder (internal/httphead: a browser's
// request head read by net/http's parser and written on, in Go's order as
// before and in the client's, its bytes recorded and its names kept) five
// times, the two sides taking turns, and prints the lowest time of each:
// the least the machine let each cost, which the load of other processes
// cannot raise.
func headOrderRows() ([]row, error) {
	fmt.Println("cost model: a request head in the client's field order (go test -bench BenchmarkHeadOrder ./internal/httphead) ...")
	root, err := testutil.ModuleRoot()
	if err != nil {
		return nil, err
	}
	best := map[string]float64{}
	allocs := map[string]int{}
	for range 5 {
		cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkHeadOrder$", "-benchmem", "-count", "1", "./internal/httphead")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go test -bench BenchmarkHeadOrder: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			m := headOrderRe.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			ns, _ := strconv.ParseFloat(m[2], 64)
			if b, ok := best[m[1]]; !ok || ns < b {
				best[m[1]] = ns
			}
			allocs[m[1]], _ = strconv.Atoi(m[3])
		}
	}
	if len(best) != 2 {
		return nil, fmt.Errorf("go test -bench BenchmarkHeadOrder: no figures for both sides: %v", best)
	}
	return []row{{
		metric: "  request head, a browser's, read and written in the client's field order (lowest of 5)",
		chain:  fmt.Sprintf("%.2f µs, %d allocs", best["client"]/1000, allocs["client"]),
		direct: fmt.Sprintf("%.2f µs, %d allocs (Go's order, as before)", best["go"]/1000, allocs["go"]),
		figure: fmt.Sprintf("%+.2f µs, %+d allocs", (best["client"]-best["go"])/1000, allocs["client"]-allocs["go"]),
		ok:     true,
	}}, nil
}
