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
		{"every interface withholds it", ":0", http.StatusNotFound, "served only on a loopback MetricsListen"},
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
