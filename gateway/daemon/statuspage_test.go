package daemon

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/gateway/daemon/daemontest"
)

// TestStatusPageOnlyOnALoopbackMetricsAddress: the status page, which
// lists the fleet's members and cooldowns without authentication, is
// served beside /metrics only when the metrics address is loopback. On
// one others reach (the sidecar's :15090 on the pod network) the probes
// and /metrics answer and the page's paths are a 404 that says why.
func TestStatusPageOnlyOnALoopbackMetricsAddress(t *testing.T) {
	for _, tc := range []struct {
		name, listen string
		status       int
		bodyHas      string
	}{
		{"a loopback address serves the page", "127.0.0.1:0", http.StatusOK, `"members"`},
		{"every interface withholds it", ":0", http.StatusNotFound, "served only on a loopback address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MetricsListen = tc.listen
			g := startGateway(t, cfg)
			_, port, _ := net.SplitHostPort(g.Metrics)
			base := "http://" + net.JoinHostPort("127.0.0.1", port)
			for _, path := range []string{"/status.json", "/status"} {
				code, body := daemontest.Get(t, http.DefaultClient, base+path)
				if code != tc.status || (path == "/status.json" && !strings.Contains(body, tc.bodyHas)) {
					t.Fatalf("%s: %d %.200s; want %d with %s", path, code, body, tc.status, tc.bodyHas)
				}
			}
			for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
				if code, _ := daemontest.Get(t, http.DefaultClient, base+path); code != http.StatusOK {
					t.Fatalf("%s: %d, want 200", path, code)
				}
			}
		})
	}
}

// TestStatusPageOnItsOwnLoopbackAddress: with a status address of its own
// (what an injected sidecar gets, reached by kubectl port-forward), the
// page is served there, and the metrics address, on every interface for
// the kubelet's probes, points to it.
func TestStatusPageOnItsOwnLoopbackAddress(t *testing.T) {
	cfg := testConfig()
	cfg.MetricsListen, cfg.StatusListen = ":0", "127.0.0.1:0"
	g := startGateway(t, cfg)
	if g.Status == "" || g.Status == g.Metrics {
		t.Fatalf("usage block names the status page at %q (metrics %q):\n%s", g.Status, g.Metrics, g.Stderr.String())
	}
	if code, body := daemontest.Get(t, http.DefaultClient, "http://"+g.Status+"/status.json"); code != http.StatusOK || !strings.Contains(body, `"members"`) {
		t.Fatalf("status address: %d %.200s", code, body)
	}
	if code, _ := daemontest.Get(t, http.DefaultClient, "http://"+g.Status+"/metrics"); code != http.StatusNotFound {
		t.Fatalf("status address serves /metrics: %d", code)
	}
	_, port, _ := net.SplitHostPort(g.Metrics)
	metrics := "http://" + net.JoinHostPort("127.0.0.1", port)
	if code, body := daemontest.Get(t, http.DefaultClient, metrics+"/status.json"); code != http.StatusNotFound || !strings.Contains(body, "served on the StatusListen address") {
		t.Fatalf("metrics address /status.json: %d %.200s", code, body)
	}
	if code, _ := daemontest.Get(t, http.DefaultClient, metrics+"/healthz"); code != http.StatusOK {
		t.Fatalf("metrics address /healthz: %d", code)
	}
}
