package e2e

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestSidecarBuild: the sidecar build (make sidecar) is the same gateway
// without the controller: it leases from a pool API and rotates through the
// members like the full binary, and has no controller command to run.
func TestSidecarBuild(t *testing.T) {
	full := testutil.BuildBinary(t)
	sidecar := testutil.BuildSidecarBinary(t)

	out, err := exec.Command(sidecar, "controller").CombinedOutput()
	if err == nil || strings.Contains(string(out), "controller-runtime") {
		t.Fatalf("the sidecar build ran `controller`: %v\n%s", err, out)
	}
	if out, err := exec.Command(full, "controller", "--help").CombinedOutput(); err != nil {
		t.Fatalf("the full build has no controller: %v\n%s", err, out)
	}

	trio := startSquids(t, "sidecar", "127.0.0.111", "127.0.0.112", "127.0.0.113")
	owner := startGateway(t, full, gwConfig{upstreams: squidURLs(trio), api: true})
	sc := startGateway(t, sidecar, gwConfig{rotation: "per-request", args: poolAPIArgs(t, "http://"+owner.apiAddr, owner.apiToken)})
	target := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.114"})
	tc := sc.tunnelClient(t, "", target.ClientTLSConfig())
	for range 6 {
		mustGetOK(t, tc, target.URL()+"/sidecar", nil)
	}
	if got, want := target.Sources(), outgoingAddrs(trio); !slices.Equal(got, want) {
		t.Fatalf("through the sidecar: sources %v, want all three %v", got, want)
	}
}

// TestSidecarRefusesARedisLeaseStore: the sidecar build links no Redis
// client, so a Redis --lease-store is refused at start with the flag named,
// while the full build still offers it (its Redis store runs in
// TestControllerReplicasOnRedis and the cmd tests).
func TestSidecarRefusesARedisLeaseStore(t *testing.T) {
	sidecar := testutil.BuildSidecarBinary(t)
	out, err := exec.Command(sidecar, "gateway", "--upstream", "http://127.0.0.1:3128",
		"--lease-store", "redis://127.0.0.1:1", "--metrics-listen", "off").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--lease-store") || !strings.Contains(string(out), "no Redis lease store") {
		t.Fatalf("the sidecar with a Redis --lease-store: %v\n%s\nwant a refusal naming the flag", err, out)
	}
	full := testutil.BuildBinary(t)
	if out, err := exec.Command(full, "gateway", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "redis://") {
		t.Fatalf("the full build does not offer a Redis --lease-store: %v\n%s", err, out)
	}
}
