package e2e

import (
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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
	// Its /metrics (the sidecar's own Prometheus client) reads with
	// Prometheus' own parser and counts what it served.
	resp, err := http.Get("http://" + sc.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the sidecar's /metrics does not parse: %v", err)
	}
	served := 0.0
	for _, m := range fams["proxyfleet_gateway_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == "ok" {
				served += m.GetCounter().GetValue()
			}
		}
	}
	if served != 6 {
		t.Fatalf("the sidecar counted %v tunnels served, want 6", served)
	}
	if rss := fams["process_resident_memory_bytes"].GetMetric(); len(rss) != 1 || rss[0].GetGauge().GetValue() < 1<<20 {
		t.Fatalf("process_resident_memory_bytes: %v", rss)
	}
	if fams["proxyfleet_gateway_request_duration_seconds"].GetType().String() != "HISTOGRAM" {
		t.Fatalf("the request duration is not a histogram: %v", fams["proxyfleet_gateway_request_duration_seconds"])
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
