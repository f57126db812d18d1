package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// sidecarMemory measures what a sidecar costs beside a crawler pod: the
// gateway binary sidecarBin in --pool-api mode, leasing from the gateway
// whose lease API is at apiAddr. It returns the sidecar's RSS idle (started,
// no request yet) and holding n idle CONNECT tunnels to the sink (n 0: idle
// only). env is added to its environment, as the injection webhook adds
// GOMAXPROCS.
func sidecarMemory(sidecarBin, apiAddr, apiToken, sinkAddr string, n int, env ...string) (idle, withTunnels int64, err error) {
	dir, err := os.MkdirTemp("", "proxyfleet-bench-sidecar-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	tokenFile := filepath.Join(dir, "pool-token")
	if err := os.WriteFile(tokenFile, []byte(apiToken+"\n"), 0o600); err != nil {
		return 0, 0, err
	}
	sc, addrs, err := testutil.LaunchProcessOnFreePorts(sidecarBin, 2, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "sidecar",
			Args: []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1],
				"--pool-api", "http://" + apiAddr, "--pool-token-file", tokenFile,
				"--allow-private-targets", "--log-level", "warn"},
			Env:       env,
			WaitAddrs: addrs,
		}
	})
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if code, err := sc.Stop(); err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "sidecar exit %d %v\n%s", code, err, sc.Output())
		}
	}()
	idle = settledRSS(sc.PID())
	if n == 0 {
		return idle, idle, nil
	}
	perTunnel, err := idleTunnelMemory(addrs[0], sinkAddr, sc.PID(), n)
	if err != nil {
		return 0, 0, fmt.Errorf("idle tunnels through the sidecar: %w", err)
	}
	return idle, idle + perTunnel*int64(n), nil
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
