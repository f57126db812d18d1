// Command bench is `make bench`: it starts one real Squid, Go target servers
// and the real proxyfleet gateway (one upstream: that Squid), and measures in
// one run, side by side, client → gateway → Squid → target against
// client → Squid → target — throughput, CPU per request, added latency and
// memory per idle tunnel — plus the lease store in process and over HTTP. Each
// figure is printed next to its target (docs/performance.md says why each is what it is).
//
// It imports the store workload (internal/storebench), the launchers it needs
// (internal/testkit/squid, internal/testkit/redis) and the packages it
// measures in process; nothing of the controller.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/storebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// config is what the flags set.
type config struct {
	duration    time.Duration
	rounds      int
	concurrency int
	latencyN    int
	idleTunnels int
	only        string
}

func main() {
	for _, ref := range references {
		if spec := os.Getenv(ref.env); spec != "" {
			fmt.Fprintf(os.Stderr, "%s: %v\n", ref.name, runReference(ref, spec))
			os.Exit(1)
		}
	}
	testing.Init() // testing.Benchmark reads the testing flags' defaults
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "length of one throughput measurement")
	flag.IntVar(&cfg.rounds, "rounds", 2, "throughput measurements per path, alternating direct and chain")
	flag.IntVar(&cfg.concurrency, "concurrency", 8, "concurrent clients in the throughput measurements")
	flag.IntVar(&cfg.latencyN, "latency-requests", 2000, "sequential requests per path for the latency figure")
	flag.IntVar(&cfg.idleTunnels, "idle-tunnels", 2000, "idle CONNECT tunnels held open for the memory figure")
	flag.DurationVar(&settleTime, "settle", settleTime, "how long a process is left alone before its RSS is read for the memory rows; 150s lets the runtime's forced collection (every 2 minutes) and its scavenger give back what parked idle tunnels no longer use")
	flag.StringVar(&cfg.only, "only", "", "sidecar: only the sidecar rows (RSS, binary size, start), without Squid; floor: only the plain keep-alive and new-tunnel rows with the relay beside the gateway (the speed goals' ratios); tunnels: only the gateway's memory per idle tunnel (-idle-tunnels of them, a direct member, no Squid); redis: only the Redis store rows; mitm: only the MITM rows")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// row is one line of the result table.
type row struct {
	metric, chain, direct, figure, target string
	ok                                    bool
}

func run(cfg config) error {
	bin, err := binary()
	if err != nil {
		return err
	}
	fmt.Printf("proxyfleet bench: %d CPUs, GOMAXPROCS %d, %s, squid %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), squidVersion())
	fmt.Printf("binary %s\nload average at start: %s\n\n", bin, loadAverage())
	switch cfg.only {
	case "", "mitm", "floor":
	case "sidecar":
		rows, err := runSidecarOnly(bin)
		if err != nil {
			return err
		}
		return printRows(rows)
	case "tunnels":
		rows, err := runTunnelsOnly(bin, cfg.idleTunnels)
		if err != nil {
			return err
		}
		return printRows(rows)
	case "redis":
		rows, err := redisBench()
		if err != nil {
			return err
		}
		return printRows(rows)
	default:
		return fmt.Errorf("-only %q: want sidecar, tunnels, redis, mitm or floor", cfg.only)
	}

	sq, err := squid.Launch(squid.Options{Name: "bench", OutgoingAddr: "127.0.0.2"})
	if err != nil {
		return err
	}
	defer sq.Close()
	plain := newPlainTarget()
	defer plain.Close()
	tlsTarget, err := testutil.LaunchTarget(testutil.TargetOptions{}, true)
	if err != nil {
		return err
	}
	defer tlsTarget.Close()

	// The gateway also serves the lease API the sidecar measurement leases from.
	const apiToken = "bench-api-token"
	apiTokenFile, err := writeTemp("api-token", apiToken+"\n")
	if err != nil {
		return err
	}
	defer os.Remove(apiTokenFile)
	gw, addrs, stopGateway, err := launchGateway("gateway", bin, 3, nil, func(addrs []string) []string {
		return []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1], "--lease-api-listen", addrs[2],
			"--lease-api-token-file", apiTokenFile,
			"--upstream", sq.URL(), "--allow-private-targets", "--log-level", "warn"}
	})
	if err != nil {
		return err
	}
	defer stopGateway()
	gwURL := "http://" + addrs[0]
	paths := []benchPath{
		{name: "direct", proxy: sq.URL()},
		{name: "chain", proxy: gwURL, pid: gw.PID()},
	}

	refs, err := startReferences(sq.Addr())
	defer refs.stop()
	if err != nil {
		return err
	}
	if cfg.only == "mitm" {
		rows, err := mitmBench(cfg, bin, sq, tlsTarget, gwURL, gw.PID(), refs.named("relay").path())
		if err != nil {
			return err
		}
		return printRows(rows)
	}
	// The gateway and the relay, the floor its goals are ratios to, take
	// turns in one measurement (direct, gateway, relay, direct, ...): the
	// ratios then compare windows seconds apart, which drift on a shared
	// machine hits alike, not phases a minute apart.
	relay := refs.named("relay")
	withRelay := append(slices.Clone(paths), relay.path())
	var rows []row
	fmt.Println("plain HTTP keep-alive throughput, the gateway and the relay in turn ...")
	plainGet := func(c *http.Client) error { return getOK(c, plain.URL) }
	res, err := throughput(cfg, withRelay, sq.PID(), plainGet, false, nil)
	if err != nil {
		return err
	}
	r, rr := res[:2], []tpResult{res[0], res[2]}
	ratio := r[1].rps / r[0].rps
	rows = append(rows,
		row{"plain HTTP keep-alive req/s", f0(r[1].rps), f0(r[0].rps), fmt.Sprintf("%.2f×", ratio), "", true},
		row{"  CPU per request: gateway vs Squid", us(r[1].gatewayCPU), us(r[0].squidCPU),
			fmt.Sprintf("%.2f×", float64(r[1].gatewayCPU)/float64(r[0].squidCPU)), "", true},
		row{"  same ratio implied by CPU per request", "", "", fmt.Sprintf("%.2f×", cpuBound(r[0], r[1])), "", true},
		row{"  Squid CPU per request (for reference)", us(r[1].squidCPU), us(r[0].squidCPU), "", "", true},
		row{"  client+target CPU per request (bench process)", us(r[1].clientCPU), us(r[0].clientCPU), "", "", true},
	)
	rows = append(rows, relay.rows("request", rr, "throughput")...)
	rows = append(rows, floorGoalRows("plain keep-alive", "request", r[1], rr[1], 1.2)...)
	for _, ref := range refs {
		if ref.name == relay.name || cfg.only == "floor" {
			continue
		}
		fmt.Printf("plain HTTP keep-alive through the %s ...\n", ref.what)
		rr, err := throughput(cfg, ref.paths(paths[0]), sq.PID(), plainGet, false, nil)
		if err != nil {
			return err
		}
		rows = append(rows, ref.rows("request", rr, "throughput")...)
		rows = append(rows, row{fmt.Sprintf("  gateway CPU per request ÷ %s's", ref.name), us(r[1].gatewayCPU), us(rr[1].gatewayCPU),
			fmt.Sprintf("%.2f×", float64(r[1].gatewayCPU)/float64(rr[1].gatewayCPU)), "", true})
	}

	fmt.Println("HTTPS, a new CONNECT tunnel per request, the gateway and the relay in turn ...")
	tlsURL := tlsTarget.URL() + "/"
	tlsGet := func(c *http.Client) error { return getOK(c, tlsURL) }
	res, err = throughput(cfg, withRelay, sq.PID(), tlsGet, true, tlsTarget.ClientTLSConfig())
	if err != nil {
		return err
	}
	r, rt := res[:2], []tpResult{res[0], res[2]}
	ratio = r[1].rps / r[0].rps
	cpuRatio := float64(r[1].gatewayCPU) / float64(r[0].squidCPU)
	rows = append(rows,
		row{"HTTPS new tunnel per request, req/s", f0(r[1].rps), f0(r[0].rps), fmt.Sprintf("%.2f×", ratio), "", true},
		row{"  same ratio implied by CPU per tunnel", "", "", fmt.Sprintf("%.2f×", cpuBound(r[0], r[1])), "", true},
		row{"  CPU per tunnel: gateway vs Squid", us(r[1].gatewayCPU), us(r[0].squidCPU), fmt.Sprintf("%.2f×", cpuRatio), "", true},
		row{"  client+target CPU per tunnel (bench process)", us(r[1].clientCPU), us(r[0].clientCPU), "", "", true},
	)
	rows = append(rows, relay.rows("tunnel", rt, "tunnel")...)
	rows = append(rows, floorGoalRows("new tunnel per request", "tunnel", r[1], rt[1], 1.1)...)
	fmt.Println("latency, sequential keep-alive requests, the relay in turn ...")
	p50, p90, err := latency(cfg, withRelay, plain.URL)
	if err != nil {
		return err
	}
	added := p50[1] - p50[0]
	rows = append(rows,
		row{"plain HTTP p50 latency", us(p50[1]), us(p50[0]), "+" + us(added), "≤ +0.10 ms", added <= 100*time.Microsecond},
		row{"  p90 latency (for reference)", us(p90[1]), us(p90[0]), "+" + us(p90[1]-p90[0]), "", true},
		row{"  relay p50 latency (the floor of an added hop, reference)", us(p50[2]), us(p50[0]), "+" + us(p50[2]-p50[0]), "", true},
	)

	if cfg.only == "floor" {
		return printRows(rows)
	}
	for _, ref := range refs {
		if ref.name == relay.name {
			continue
		}
		fmt.Printf("HTTPS, a new CONNECT tunnel per request, through the %s ...\n", ref.what)
		rt, err := throughput(cfg, ref.paths(paths[0]), sq.PID(), tlsGet, true, tlsTarget.ClientTLSConfig())
		if err != nil {
			return err
		}
		rows = append(rows, ref.rows("tunnel", rt, "tunnel")...)
	}

	rows = append(rows, row{metric: "cost model (per unit: the gateway beside the floor)", ok: true})
	costRows, err := syscallRows(gw.PID(), gwURL, refs.named("relay"), plain.URL, tlsURL, tlsTarget.ClientTLSConfig())
	if err != nil {
		return err
	}
	rows = append(rows, costRows...)
	allocs, err := allocRows()
	if err != nil {
		return err
	}
	rows = append(rows, allocs...)
	orderRows, err := headOrderRows()
	if err != nil {
		return err
	}
	rows = append(rows, orderRows...)

	mitmRows, err := mitmBench(cfg, bin, sq, tlsTarget, gwURL, gw.PID(), relay.path())
	if err != nil {
		return err
	}
	rows = append(rows, mitmRows...)

	fmt.Printf("memory of %d idle CONNECT tunnels ...\n", cfg.idleTunnels)
	sink, err := newSink()
	if err != nil {
		return err
	}
	defer sink.Close()
	squidMem, err := idleTunnelMemory(sq.Addr(), sink.addr, sq.PID(), cfg.idleTunnels)
	if err != nil {
		return fmt.Errorf("idle tunnels through squid: %w", err)
	}
	gwMem, err := idleTunnelMemory(addrs[0], sink.addr, gw.PID(), cfg.idleTunnels)
	if err != nil {
		return fmt.Errorf("idle tunnels through the gateway: %w", err)
	}
	rows = append(rows, row{"memory per idle tunnel (RSS delta)", kib(gwMem), kib(squidMem) + " (Squid alone)", "", "≤ 8 KiB", gwMem <= 8<<10})

	scRows, err := sidecarRows(sidecarBinary(bin), addrs[2], apiToken, sink.addr, plain.URL)
	if err != nil {
		return err
	}
	rows = append(rows, scRows...)

	fmt.Println("lease store ...")
	storeRows, err := storeBench()
	if err != nil {
		return err
	}
	overHTTP, err := apiBench()
	if err != nil {
		return err
	}
	rows = append(rows, storeRows...)
	rows = append(rows, row{"lease acquire+release over HTTP", f0(overHTTP) + "/s", "", "", "≥ 10k/s", overHTTP >= 10e3})
	redisRows, err := redisBench()
	if err != nil {
		return err
	}
	rows = append(rows, redisRows...)

	return printRows(rows)
}

// printRows prints the result table after the load average at the end.
func printRows(rows []row) error {
	fmt.Printf("\nload average at end: %s (other work on the machine skews every figure)\n\n", loadAverage())
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tgateway chain\tdirect Squid\tchain/direct\tgoal\tmet")
	for _, r := range rows {
		met := ""
		if r.target != "" {
			met = "yes"
			if !r.ok {
				met = "NO"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.metric, r.chain, r.direct, r.figure, r.target, met)
	}
	return tw.Flush()
}

// binary is $PROXYFLEET_BIN (set by make bench) or a fresh build.
func binary() (string, error) {
	if bin := os.Getenv("PROXYFLEET_BIN"); bin != "" {
		return bin, nil
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "proxyfleet-bench-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "proxyfleet")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/proxyfleet")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, msg)
	}
	return out, nil
}

// writeTemp writes content to a new temporary file and returns its path.
func writeTemp(name, content string) (string, error) {
	f, err := os.CreateTemp("", "proxyfleet-bench-"+name+"-")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	return strings.Join(f[:min(3, len(f))], " ")
}

func squidVersion() string {
	out, err := exec.Command(squid.Binary, "-v").Output()
	if err != nil {
		return "?"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(first, "Squid Cache: Version ")
}

// benchPath is one way to the target: through Squid alone, or through the gateway.
// benchPath is one way to Squid: proxy is the address the clients use, pid
// the proxy process in front of Squid whose CPU the path counts as the
// gateway's (0 on the direct path, which has none).
type benchPath struct {
	name  string
	proxy string
	pid   int
}

// tpResult is one path's throughput and the CPU the proxies spent per request.
type tpResult struct {
	rps                  float64
	gatewayCPU, squidCPU time.Duration
	// clientCPU is the bench process's own CPU per request: the client and
	// the targets, the same work on both paths.
	clientCPU time.Duration
}

// cpuBound is the throughput ratio the measured CPU costs imply on a machine
// with nothing else running: every request costs client+target+proxies CPU,
// so chain/direct = direct's total / chain's total. It is immune to what
// other processes take from the shared cores, which the measured ratio is not.
func cpuBound(direct, chain tpResult) float64 {
	d := direct.clientCPU + direct.squidCPU + direct.gatewayCPU
	c := chain.clientCPU + chain.squidCPU + chain.gatewayCPU
	return float64(d) / float64(c)
}

// throughput runs cfg.rounds measurements per path, taking the paths in
// turn so that drift on a shared machine hits them alike, and sums them.
// squidPID is the Squid every path ends at.
func throughput(cfg config, paths []benchPath, squidPID int, do func(*http.Client) error, newConnEach bool, tlsConf *tls.Config) ([]tpResult, error) {
	type acc struct {
		n        int64
		elapsed  time.Duration
		gwCPU    time.Duration
		squidCPU time.Duration
		selfCPU  time.Duration
	}
	accs := make([]acc, len(paths))
	clients := make([]*http.Client, len(paths))
	for i, p := range paths {
		c, err := benchClient(p.proxy, cfg.concurrency, newConnEach, tlsConf)
		if err != nil {
			return nil, err
		}
		defer c.CloseIdleConnections()
		clients[i] = c
		// Warm up: connections, the gateway's lease, caches.
		if _, _, err := load(c, do, cfg.concurrency, 500*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", p.name, err)
		}
	}
	for round := 0; round < cfg.rounds; round++ {
		for i, p := range paths {
			g0, s0, c0 := cpuTime(p.pid), cpuTime(squidPID), cpuTime(os.Getpid())
			n, elapsed, err := load(clients[i], do, cfg.concurrency, cfg.duration)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			accs[i].n += n
			accs[i].elapsed += elapsed
			accs[i].gwCPU += cpuTime(p.pid) - g0
			accs[i].squidCPU += cpuTime(squidPID) - s0
			accs[i].selfCPU += cpuTime(os.Getpid()) - c0
		}
	}
	out := make([]tpResult, len(paths))
	for i, a := range accs {
		out[i] = tpResult{
			rps:        float64(a.n) / a.elapsed.Seconds(),
			gatewayCPU: a.gwCPU / time.Duration(max(a.n, 1)),
			squidCPU:   a.squidCPU / time.Duration(max(a.n, 1)),
			clientCPU:  a.selfCPU / time.Duration(max(a.n, 1)),
		}
		fmt.Printf("  %-6s %8.0f req/s  gateway %9s/req  squid %9s/req  client+target %9s/req\n",
			paths[i].name, out[i].rps, us(out[i].gatewayCPU), us(out[i].squidCPU), us(out[i].clientCPU))
	}
	return out, nil
}

// load runs `workers` loops of do for d and counts successes; any failure ends it.
func load(c *http.Client, do func(*http.Client) error, workers int, d time.Duration) (int64, time.Duration, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := do(c); err != nil {
					once.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				n.Add(1)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return n.Load(), time.Since(start), firstErr
}

// benchClient proxies through proxy; newConnEach opens a new connection (and
// so a new CONNECT tunnel and TLS handshake) for every request.
func benchClient(proxy string, conns int, newConnEach bool, tlsConf *tls.Config) (*http.Client, error) {
	u, err := url.Parse(proxy)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:               http.ProxyURL(u),
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableKeepAlives:   newConnEach,
		TLSClientConfig:     tlsConf,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

func getOK(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Squid names its error in a header; the gateway in its own.
		return fmt.Errorf("GET %s: %s %s%s", u, resp.Status, resp.Header.Get("X-Squid-Error"), resp.Header.Get("X-Proxyfleet-Reason"))
	}
	return nil
}

// latency alternates one sequential request per path and returns the p50
// and the p90 of each path, in the order of paths.
func latency(cfg config, paths []benchPath, target string) (p50, p90 []time.Duration, err error) {
	samples := make([][]time.Duration, len(paths))
	clients := make([]*http.Client, len(paths))
	for i, p := range paths {
		c, cerr := benchClient(p.proxy, 1, false, nil)
		if cerr != nil {
			return nil, nil, cerr
		}
		defer c.CloseIdleConnections()
		clients[i] = c
		for range 50 { // warm-up
			if err := getOK(c, target); err != nil {
				return nil, nil, err
			}
		}
	}
	for range cfg.latencyN {
		for i := range paths {
			t0 := time.Now()
			if err := getOK(clients[i], target); err != nil {
				return nil, nil, err
			}
			samples[i] = append(samples[i], time.Since(t0))
		}
	}
	for _, s := range samples {
		slices.Sort(s)
		p50 = append(p50, s[(len(s)-1)/2])
		p90 = append(p90, s[int(float64(len(s)-1)*0.9)])
	}
	return p50, p90, nil
}

// idleTunnelMemory opens n CONNECT tunnels through the proxy at proxyAddr to
// the sink, moves a few bytes each way in each (so buffers a relay allocates
// on first use are counted), holds them idle, and returns the proxy's RSS
// growth per tunnel settleTime after. The tunnels are closed before it
// returns.
func idleTunnelMemory(proxyAddr, sinkAddr string, pid, n int) (int64, error) {
	per, err := idleTunnelMemoryAt(proxyAddr, sinkAddr, pid, n, settleTime)
	if err != nil {
		return 0, err
	}
	return per[0], nil
}

// idleTunnelMemoryAt is idleTunnelMemory read at each of reads after the
// tunnels are open (ascending), a growth per tunnel for each.
func idleTunnelMemoryAt(proxyAddr, sinkAddr string, pid, n int, reads ...time.Duration) ([]int64, error) {
	before := settledRSS(pid)
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conn, resp, err := testutil.ConnectTunnel(proxyAddr, sinkAddr, nil, 20*time.Second)
			if err != nil {
				errs <- err
				return
			}
			if conn == nil {
				errs <- fmt.Errorf("CONNECT answered %s", resp.Status)
				return
			}
			conns[i] = conn
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := conn.Write([]byte("ping\n")); err != nil {
				errs <- err
				return
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(conn, buf); err != nil {
				errs <- fmt.Errorf("echo through the tunnel: %w", err)
				return
			}
			_ = conn.SetDeadline(time.Time{})
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	opened := time.Now()
	var per []int64
	for _, d := range reads {
		time.Sleep(time.Until(opened.Add(d)))
		per = append(per, (rssBytes(pid)-before)/int64(n))
	}
	return per, nil
}

// settleTime is how long settledRSS waits (-settle). The default reads
// memory right after a change, as a burst of new tunnels leaves it: an idle
// tunnel's relay goroutines are parked after a second, but what their
// stacks held returns to the kernel only after a collection and the
// scavenger, which an idle process runs every two minutes.
var settleTime = 1500 * time.Millisecond

// settledRSS is pid's RSS once it has had settleTime to finish reacting to
// the last change.
func settledRSS(pid int) int64 {
	time.Sleep(settleTime)
	return rssBytes(pid)
}

// sink accepts connections, echoes the first 5 bytes and then holds them open.
type sink struct {
	ln   net.Listener
	addr string
	mu   sync.Mutex
	held []net.Conn
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln, addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.held = append(s.held, c)
			s.mu.Unlock()
			go func() {
				buf := make([]byte, 5)
				if _, err := io.ReadFull(c, buf); err == nil {
					_, _ = c.Write(buf)
				}
			}()
		}
	}()
	return s, nil
}

func (s *sink) Close() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.held {
		c.Close()
	}
}

// plainTarget is a minimal keep-alive HTTP server: the benchmark measures
// proxies, so the target should cost as little CPU as possible.
type plainTarget struct {
	srv *httptest.Server
	URL string
}

func newPlainTarget() *plainTarget {
	body := []byte(`{"ok":true}` + "\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Set("Cache-Control", "no-store")
		_, _ = w.Write(body)
	}))
	return &plainTarget{srv: srv, URL: srv.URL + "/"}
}

func (p *plainTarget) Close() { p.srv.Close() }

// cpuTime is utime+stime of pid from /proc/<pid>/stat; 0 for pid 0, the
// direct path's proxy, which it has none of.
func cpuTime(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may contain spaces; fields are counted after its ')'.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// rssBytes is VmRSS of pid.
func rssBytes(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// apiBench is helper B's BenchmarkAPIAcquireRelease: acquire+release pairs
// through leaseapi.Client against the real lease API handler on loopback.
func apiBench() (float64, error) {
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers(benchMembers())
	srv := httptest.NewServer(leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: "bench-token"}))
	defer srv.Close()
	client, err := leaseapi.NewClient(srv.URL, "bench-token", nil)
	if err != nil {
		return 0, err
	}
	return acquireReleaseRate(client, 4)
}

// acquireReleaseRate is acquire+release cycles per second on p from
// GOMAXPROCS×parallelism goroutines; the first failed call fails it.
func acquireReleaseRate(p pool.Pool, parallelism int) (float64, error) {
	var failed atomic.Value
	res := testing.Benchmark(func(b *testing.B) {
		b.SetParallelism(parallelism)
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				l, err := p.Acquire(ctx, pool.AcquireRequest{Target: "example.com"})
				if err == nil {
					err = p.Release(ctx, l.ID)
				}
				if err != nil {
					failed.Store(err)
					return
				}
			}
		})
	})
	if err, _ := failed.Load().(error); err != nil {
		return 0, err
	}
	return float64(res.N) / res.T.Seconds(), nil
}

// storeRounds is how many times storeBench measures each figure, the sizes
// interleaved, before taking the median: on a shared machine one load spike
// would otherwise decide the 10,000 ÷ 10 members ratio.
const storeRounds = 3

// storeBench measures pool.Store acquire+release cycles (the workload of
// internal/storebench, which BenchmarkStoreAcquireRelease also runs) at each
// pool size with and without a selector, and from GOMAXPROCS goroutines at
// 10 members; each figure is the median of storeRounds. Goals:
// ≥ 200k/s; ≤ 5 µs per cycle at 10,000 members and at most twice
// the 10-member cost.
func storeBench() ([]row, error) {
	type variant struct {
		n        int
		sel      bool
		parallel bool
	}
	var variants []variant
	for _, sel := range []bool{false, true} {
		for _, n := range storebench.Sizes {
			variants = append(variants, variant{n: n, sel: sel})
		}
	}
	variants = append(variants, variant{n: storebench.Sizes[0], parallel: true})
	samples := make([][]time.Duration, len(variants))
	for range storeRounds {
		for i, v := range variants {
			s := storebench.NewStore(v.n)
			req := storebench.Request(v.sel)
			r := testing.Benchmark(func(b *testing.B) {
				if v.parallel {
					storebench.AcquireReleaseParallel(b, s, req)
				} else {
					storebench.AcquireRelease(b, s, req)
				}
			})
			if r.N == 0 { // the benchmark failed: an acquire was refused
				return nil, fmt.Errorf("store benchmark at %d members (selector %v) failed", v.n, v.sel)
			}
			samples[i] = append(samples[i], time.Duration(r.NsPerOp()))
		}
	}
	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
		return ds[len(ds)/2]
	}
	figure := func(d time.Duration) string {
		return fmt.Sprintf("%.2f µs, %s/s", float64(d)/1e3, f0(float64(time.Second)/float64(max(d, 1))))
	}
	rows := []row{{metric: fmt.Sprintf("lease acquire+release in process (median of %d)", storeRounds), ok: true}}
	var base time.Duration
	for i, v := range variants {
		d := median(samples[i])
		switch {
		case v.parallel:
			rows = append(rows, row{metric: fmt.Sprintf("  %d members, GOMAXPROCS goroutines", v.n), chain: figure(d), ok: true})
			continue
		case v.n == storebench.Sizes[0]:
			base = d
		}
		what := "no selector"
		if v.sel {
			what = fmt.Sprintf("selector %v (¼ of the members)", storebench.Selector)
		}
		r := row{metric: fmt.Sprintf("  %d members, %s", v.n, what), chain: figure(d), ok: true}
		switch v.n {
		case storebench.Sizes[0]:
			r.target, r.ok = "≥ 200k/s", d <= 5*time.Microsecond
		case storebench.Sizes[len(storebench.Sizes)-1]:
			r.figure = fmt.Sprintf("%.2f× %d members", float64(d)/float64(base), storebench.Sizes[0])
			r.target, r.ok = "≤ 5 µs, ≤ 2.00×", d <= 5*time.Microsecond && d <= 2*base
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func benchMembers() []pool.Member {
	var ms []pool.Member
	for i := range 10 {
		ms = append(ms, pool.Member{Name: fmt.Sprintf("m%02d", i), URL: &url.URL{Scheme: "http", Host: "127.0.0.1:3128"}})
	}
	return ms
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func us(d time.Duration) string {
	if d < 0 {
		return "-" + us(-d)
	}
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

func kib(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024) }

// runTunnelsOnly is -only tunnels: the gateway's memory per idle tunnel
// alone, n tunnels through a gateway whose one member is direct (no Squid
// in the way, so n can reach what the descriptor limit allows: two per
// tunnel in the gateway, two in this process).
func runTunnelsOnly(bin string, n int) ([]row, error) {
	gw, addrs, stop, err := launchGateway("gateway", bin, 2, []string{"GOMAXPROCS=2"}, func(addrs []string) []string {
		return []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1], "--allow-private-targets", "--log-level", "warn"}
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	sink, err := newSink()
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	fmt.Printf("memory of %d idle CONNECT tunnels through a gateway with a direct member, read %v after ...\n", n, settleTime)
	mem, err := idleTunnelMemory(addrs[0], sink.addr, gw.PID(), n)
	if err != nil {
		return nil, fmt.Errorf("idle tunnels through the gateway: %w", err)
	}
	return []row{{fmt.Sprintf("memory per idle tunnel (RSS delta, %d tunnels, read %v after)", n, settleTime), kib(mem), "", "", "≤ 8 KiB", mem <= 8<<10}}, nil
}

// launchGateway starts the gateway binary bin, called name in its output,
// on ports free loopback ports with the arguments args builds from their
// addresses (and env added to its environment), and waits until it
// listens on all of them. stop ends it, printing its output when it did
// not exit cleanly.
func launchGateway(name, bin string, ports int, env []string, args func(addrs []string) []string) (gw *testutil.Process, addrs []string, stop func(), err error) {
	gw, addrs, err = testutil.LaunchProcessOnFreePorts(bin, ports, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{Name: name, Args: args(addrs), Env: env, WaitAddrs: addrs}
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return gw, addrs, func() {
		if code, err := gw.Stop(); err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "%s exit %d %v\n%s", name, code, err, gw.Output())
		}
	}, nil
}
