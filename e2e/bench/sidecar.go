package main

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/daemon"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// The sidecar's goals (docs/performance.md): what one injected gateway
// costs beside every crawler pod.
const (
	sidecarIdleGoal    = 12 << 20
	sidecarTunnelsGoal = 20 << 20
	sidecarBinaryGoal  = 15_000_000
	sidecarStartGoal   = 100 * time.Millisecond
)

// sidecarRows measures the sidecar binary against the lease API at apiAddr:
// RSS idle and holding 1000 idle tunnels to the sink with GOMAXPROCS=2
// (what the injection webhook sets with the default resources, on any
// node), idle with GOMAXPROCS=64 for reference (a 64-core node without
// the webhook's setting), the binary's size, and the time from exec to
// the first request served through it (median of 5 starts); then, with
// $PROXYFLEET_SIDECAR_MITM_BIN set (make bench sets it), the same memory
// and size of the build with mirroring, for reference.
func sidecarRows(sidecarBin, apiAddr, apiToken, sinkAddr, targetURL string) ([]row, error) {
	fmt.Printf("sidecar (%s) idle, then holding 1000 idle tunnels ...\n", filepath.Base(sidecarBin))
	sc, err := sidecarMemory(sidecarBin, apiAddr, apiToken, sinkAddr, 1000, "GOMAXPROCS=2")
	if err != nil {
		return nil, err
	}
	wide, err := sidecarMemory(sidecarBin, apiAddr, apiToken, sinkAddr, 0, "GOMAXPROCS=64")
	if err != nil {
		return nil, err
	}
	anon, pss, err := sidecarsOnOneNode(sidecarBin, apiAddr, apiToken, sidecarsPerNode)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(sidecarBin)
	if err != nil {
		return nil, err
	}
	var starts []time.Duration
	for range 5 {
		d, err := sidecarStart(sidecarBin, apiAddr, apiToken, targetURL)
		if err != nil {
			return nil, err
		}
		starts = append(starts, d)
	}
	slices.Sort(starts)
	start := starts[len(starts)/2]
	rows := []row{
		{"sidecar RSS idle (--lease-api, no traffic yet, GOMAXPROCS 2)", mib(sc.idle), "", "", "≤ 12 MiB", sc.idle <= sidecarIdleGoal},
		{"  the same with GOMAXPROCS 64 (a 64-core node, reference)", mib(wide.idle), "", "", "", true},
		{"  of it anonymous (heap, stacks, runtime: each pod's own), mean of 10 on one node", mib(anon), "", "", "", true},
		{"  PSS of each of 10 sidecars on one node (the binary's pages are shared page cache)", mib(pss), "", "", "", true},
		{"sidecar RSS holding 1000 idle tunnels (10 s after they opened)", mib(sc.tunnels), "", "", "≤ 20 MiB", sc.tunnels <= sidecarTunnelsGoal},
		{fmt.Sprintf("  the same %v after they opened (the burst's peak, reference)", settleTime), mib(sc.tunnelsPeak), "", "", "", true},
		{"sidecar binary size", fmt.Sprintf("%.1f MB", float64(st.Size())/1e6), "", "", "≤ 15 MB", st.Size() <= sidecarBinaryGoal},
		{"sidecar start to first request served (median of 5)", fmt.Sprintf("%.0f ms", float64(start)/float64(time.Millisecond)),
			"", "", "≤ 100 ms", start <= sidecarStartGoal},
	}
	mitmBin := os.Getenv("PROXYFLEET_SIDECAR_MITM_BIN")
	if mitmBin == "" {
		return rows, nil
	}
	// The build with ClientHello mirroring, which the webhook runs for
	// MITM pods: a reference beside the goals, which are the lean one's.
	fmt.Printf("sidecar (%s) idle, then holding 1000 idle tunnels ...\n", filepath.Base(mitmBin))
	mm, err := sidecarMemory(mitmBin, apiAddr, apiToken, sinkAddr, 1000, "GOMAXPROCS=2")
	if err != nil {
		return nil, err
	}
	mst, err := os.Stat(mitmBin)
	if err != nil {
		return nil, err
	}
	return append(rows,
		row{"MITM pods' sidecar (with mirroring, reference): RSS idle", mib(mm.idle), "", "", "", true},
		row{"  holding 1000 idle tunnels (10 s after they opened)", mib(mm.tunnels), "", "", "", true},
		row{"  binary size", fmt.Sprintf("%.1f MB", float64(mst.Size())/1e6), "", "", "", true},
	), nil
}

// sidecarMemory measures what a sidecar costs beside a crawler pod: the
// gateway binary sidecarBin in --lease-api mode, leasing from the gateway
// whose lease API is at apiAddr. It returns the sidecar's RSS idle (started,
// no request yet) and holding n idle CONNECT tunnels to the sink (n 0: idle
// only), at rest (sidecarTunnelsAtRest after they opened) and at the
// burst's peak (settleTime after). env is added to its environment, as the
// injection webhook adds GOMAXPROCS.
func sidecarMemory(sidecarBin, apiAddr, apiToken, sinkAddr string, n int, env ...string) (m sidecarMem, err error) {
	tokenFile, cleanup, err := sidecarToken(apiToken)
	if err != nil {
		return m, err
	}
	defer cleanup()
	sc, addrs, err := launchSidecar(sidecarBin, apiAddr, tokenFile, env)
	if err != nil {
		return m, err
	}
	defer func() {
		if code, err := sc.Stop(); err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "sidecar exit %d %v\n%s", code, err, sc.Output())
		}
	}()
	time.Sleep(sidecarAtRest)
	m.idle = rssBytes(sc.PID())
	if n == 0 {
		return m, nil
	}
	per, err := idleTunnelMemoryAt(addrs[0], sinkAddr, sc.PID(), n, settleTime, sidecarTunnelsAtRest)
	if err != nil {
		return m, fmt.Errorf("idle tunnels through the sidecar: %w", err)
	}
	m.tunnelsPeak, m.tunnels = m.idle+per[0]*int64(n), m.idle+per[1]*int64(n)
	return m, nil
}

// sidecarMem is a sidecar's RSS idle, and holding the tunnels at rest and
// at their burst's peak.
type sidecarMem struct{ idle, tunnels, tunnelsPeak int64 }

// sidecarTunnelsAtRest is when the memory of a sidecar holding idle
// tunnels is read: after they opened, parked (gateway.DefaultTunnelIdleAfter)
// and the burst's memory was given back (the parker does that a second
// after the last park of a burst), as a crawler pod holds its idle
// connections for minutes, not a second after it opened them.
const sidecarTunnelsAtRest = 10 * time.Second

// sidecarStart is the time from starting the sidecar process to the
// first plain GET of targetURL answered 200 through it, polled every
// millisecond: what a crawler container started right after it waits.
func sidecarStart(sidecarBin, apiAddr, apiToken, targetURL string) (time.Duration, error) {
	tokenFile, cleanup, err := sidecarToken(apiToken)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		addrs = append(addrs, ln.Addr().String())
		ln.Close()
	}
	proxy := &url.URL{Scheme: "http", Host: addrs[0]}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}
	cmd := exec.Command(sidecarBin, sidecarArgs(addrs[0], addrs[1], apiAddr, tokenFile)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for time.Since(t0) < 5*time.Second {
		resp, err := client.Get(targetURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(t0), nil
			}
		}
		time.Sleep(time.Millisecond)
	}
	return 0, fmt.Errorf("the sidecar served no request within 5s of its start")
}

// sidecarAtRest is how long a sidecar runs before its idle memory is
// read: past the second time a gateway gives back its binary's start
// pages (daemon.StartSettle), so that the figure is a sidecar at rest, as
// crawler pods hold it for hours, not one that has only started.
const sidecarAtRest = daemon.StartSettle + 2*time.Second

// sidecarsPerNode is how many sidecars sidecarsOnOneNode runs side by side.
const sidecarsPerNode = 10

// sidecarsOnOneNode runs n idle sidecars at once, as n crawler pods on one
// node run the same image, and returns the mean of their anonymous memory
// and of their PSS (smaps_rollup). Most of a sidecar's RSS is the binary's
// text and read-only data mapped from the image's file: every container
// started from that layer maps the same page-cache pages, so what each
// further pod adds is its anonymous memory, and PSS splits the shared pages
// among the processes that map them.
func sidecarsOnOneNode(sidecarBin, apiAddr, apiToken string, n int) (anon, pss int64, err error) {
	tokenFile, cleanup, err := sidecarToken(apiToken)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	var scs []*testutil.Process
	defer func() {
		for _, sc := range scs {
			_, _ = sc.Stop()
		}
	}()
	for range n {
		sc, _, err := launchSidecar(sidecarBin, apiAddr, tokenFile, []string{"GOMAXPROCS=2"})
		if err != nil {
			return 0, 0, err
		}
		scs = append(scs, sc)
	}
	time.Sleep(sidecarAtRest)
	for _, sc := range scs {
		r, err := smapsRollup(sc.PID())
		if err != nil {
			return 0, 0, err
		}
		anon += r["Anonymous"]
		pss += r["Pss"]
	}
	return anon / int64(n), pss / int64(n), nil
}

// smapsRollup reads /proc/pid/smaps_rollup: each "Name: N kB" line in bytes.
func smapsRollup(pid int) (map[string]int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m[strings.TrimSuffix(f[0], ":")] = kb << 10
			}
		}
	}
	if _, ok := m["Pss"]; !ok {
		return nil, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
	}
	return m, nil
}

// launchSidecar starts sidecarBin leasing from apiAddr with the token in
// tokenFile, on two free loopback ports (proxy, metrics), with env added to
// its environment, and waits until it listens on both; the caller stops it.
func launchSidecar(sidecarBin, apiAddr, tokenFile string, env []string) (*testutil.Process, []string, error) {
	return testutil.LaunchProcessOnFreePorts(sidecarBin, 2, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{Name: "sidecar", Args: sidecarArgs(addrs[0], addrs[1], apiAddr, tokenFile), Env: env, WaitAddrs: addrs}
	})
}

func sidecarArgs(listen, metrics, apiAddr, tokenFile string) []string {
	return []string{"gateway", "--listen", listen, "--metrics-listen", metrics,
		"--lease-api", "http://" + apiAddr, "--pool-token-file", tokenFile,
		"--allow-private-targets", "--log-level", "warn"}
}

func sidecarToken(apiToken string) (file string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "proxyfleet-bench-sidecar-")
	if err != nil {
		return "", nil, err
	}
	file = filepath.Join(dir, "pool-token")
	if err := os.WriteFile(file, []byte(apiToken+"\n"), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return file, func() { os.RemoveAll(dir) }, nil
}

// runSidecarOnly is -only sidecar: the sidecar rows alone, leasing from a
// full gateway's lease API whose one member is direct (no Squid), in a few
// seconds instead of a full make bench.
func runSidecarOnly(bin string) ([]row, error) {
	const apiToken = "bench-api-token"
	apiTokenFile, err := writeTemp("api-token", apiToken+"\n")
	if err != nil {
		return nil, err
	}
	defer os.Remove(apiTokenFile)
	_, addrs, stop, err := launchGateway("gateway", bin, 3, nil, func(addrs []string) []string {
		return []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1], "--lease-api-listen", addrs[2],
			"--lease-api-token-file", apiTokenFile, "--allow-private-targets", "--log-level", "warn"}
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
	plain := newPlainTarget()
	defer plain.Close()
	return sidecarRows(sidecarBinary(bin), addrs[2], apiToken, sink.addr, plain.URL)
}

// sidecarBinary is $PROXYFLEET_SIDECAR_BIN (set by make bench: the
// -tags sidecar build), else the full binary.
func sidecarBinary(full string) string {
	if bin := os.Getenv("PROXYFLEET_SIDECAR_BIN"); bin != "" {
		return bin
	}
	return full
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
