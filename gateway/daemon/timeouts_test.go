package daemon

import (
	"net/http"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestGatewayHTTPServersCloseStalledConnections: the lease API and the
// metrics address cut off a client that announced a body and stopped
// sending it, and a kept-alive connection left idle, after their read and
// idle timeouts (shrunk here). With a header timeout only, each such
// client held its connection and a file descriptor for as long as it
// liked; enough of them took the descriptors the proxy port needs.
func TestGatewayHTTPServersCloseStalledConnections(t *testing.T) {
	cfg := testConfig()
	cfg.APIListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTPTimeouts = httpserver.Timeouts{Read: 300 * time.Millisecond, Idle: 300 * time.Millisecond}
	g := startGateway(t, cfg)
	for _, tc := range []struct {
		name string
		hold func(t *testing.T) *testutil.HeldConn
	}{
		{"a lease request whose body stalls", func(t *testing.T) *testutil.HeldConn {
			return testutil.StallBody(t, g.API, http.MethodPost, "/v1/leases", "Content-Type: application/json")
		}},
		{"a request to the metrics address whose body stalls", func(t *testing.T) *testutil.HeldConn {
			return testutil.StallBody(t, g.Metrics, http.MethodPost, "/metrics")
		}},
		{"an idle connection to the lease API", func(t *testing.T) *testutil.HeldConn {
			return testutil.KeepIdle(t, g.API, "/healthz")
		}},
		{"an idle connection to the metrics address", func(t *testing.T) *testutil.HeldConn {
			return testutil.KeepIdle(t, g.Metrics, "/healthz")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.hold(t).Closed(20 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}
