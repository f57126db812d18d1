package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestSidecarMirrorsOnlyInItsMITMBuild: the lean sidecar (the sidecar
// image's entrypoint, -tags nomirror) refuses --mitm-fingerprint mirror,
// the default, naming the flag and where mirroring is, and a tunnel that
// asks for it by header; with go it still intercepts. The MITM build (what
// the webhook runs for proxyfleet.io/mitm pods) mirrors by default.
func TestSidecarMirrorsOnlyInItsMITMBuild(t *testing.T) {
	full := testutil.BuildBinary(t)
	lean := testutil.BuildSidecarBinary(t)
	withMirror := testutil.BuildSidecarMITMBinary(t)
	dir := t.TempDir()
	caFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if out, err := exec.Command(full, "mitm-ca", "init", "--cert", caFile, "--key", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("mitm-ca init: %v\n%s", err, out)
	}
	site := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.117"})
	upstreamCA := filepath.Join(dir, "site.pem")
	writeFile(t, upstreamCA, string(site.CertPEM()))
	mitmArgs := []string{"--mitm-ca-cert", caFile, "--mitm-ca-key", keyFile, "--upstream-ca-file", upstreamCA}

	out, err := exec.Command(lean, append([]string{"gateway", "--upstream", "http://127.0.0.1:1", "--metrics-listen", "off", "--listen", "127.0.0.1:0"}, mitmArgs...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--mitm-fingerprint") || !strings.Contains(string(out), "leaves ClientHello mirroring out") || !strings.Contains(string(out), "/proxyfleet-mitm") {
		t.Fatalf("the lean sidecar with MITM and the default fingerprint: %v\n%s\nwant a refusal naming --mitm-fingerprint and /proxyfleet-mitm", err, out)
	}

	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	squids := startSquids(t, "sidecar-mitm", "127.0.0.116")
	for _, tc := range []struct {
		name    string
		bin     string
		args    []string
		mirrors bool
	}{
		{"the lean build intercepts with go", lean, []string{"--mitm-fingerprint", "go"}, false},
		{"the MITM build mirrors by default", withMirror, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, tc.bin, gwConfig{upstreams: squidURLs(squids), args: append(slices.Clone(mitmArgs), tc.args...)})
			// The client trusts only the gateway's CA: a 200 is an
			// intercepted request that reached the site.
			path := "/through-" + filepath.Base(tc.bin)
			mustGetOK(t, g.client(t, "", &tls.Config{RootCAs: roots}), site.URL()+path, nil)
			if !slices.ContainsFunc(site.Requests(), func(r testutil.SeenRequest) bool { return r.URI == path }) {
				t.Fatalf("the site did not see %s", path)
			}
			// Only a mirroring gateway makes the site's handshake itself
			// (under go the member's Transport does).
			resp, err := http.Get("http://" + g.metricsAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			metrics, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			siteHandshakes := false
			for _, l := range strings.Split(string(metrics), "\n") {
				if strings.HasPrefix(l, `proxyfleet_gateway_mitm_handshakes_total{leg="site"`) && !strings.HasSuffix(l, " 0") {
					siteHandshakes = true
				}
			}
			if got := siteHandshakes; got != tc.mirrors {
				t.Fatalf("site-leg handshakes counted: %v, want %v (mirroring)", got, tc.mirrors)
			}
		})
	}
	g := startGateway(t, lean, gwConfig{upstreams: squidURLs(squids), args: append(slices.Clone(mitmArgs), "--mitm-fingerprint", "go")})
	conn, resp, err := testutil.ConnectTunnel(g.addr, site.Addr(), http.Header{"X-Proxyfleet-Fingerprint": {"mirror"}}, 10*time.Second)
	if conn != nil {
		conn.Close()
	}
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a tunnel asking the lean sidecar for mirroring: %v %v, want a 400", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "leaves ClientHello mirroring out") {
		t.Fatalf("the refusal says %q, want why", body)
	}
}
