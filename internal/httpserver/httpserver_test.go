package httpserver_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// serve runs New(h) with t on a free loopback port until the test ends.
func serve(tb testing.TB, h http.Handler, t httpserver.Timeouts) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := httpserver.New(h, nil, t)
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func TestServerClosesConnectionsThatStall(t *testing.T) {
	// The handler reads the body, as the lease API's does: the server
	// must not wait for it for ever.
	readBody := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })
	shrunk := httpserver.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Idle: 300 * time.Millisecond}
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, addr string) *testutil.HeldConn
	}{
		{"a body that stops after its first byte", func(t *testing.T, addr string) *testutil.HeldConn {
			return testutil.StallBody(t, addr, http.MethodPost, "/")
		}},
		{"a kept-alive connection nobody uses", func(t *testing.T, addr string) *testutil.HeldConn {
			return testutil.KeepIdle(t, addr, "/")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.hold(t, serve(t, readBody, shrunk))
			// Generous: the bound is 300ms; without one the connection
			// stays open as long as the client keeps it.
			took, err := s.Closed(15 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("closed after %s", took)
		})
	}
}

func TestNewDefaultsEveryTimeout(t *testing.T) {
	s := httpserver.New(http.NotFoundHandler(), nil, httpserver.Timeouts{})
	if s.ReadHeaderTimeout != httpserver.ReadHeaderTimeout || s.ReadTimeout != httpserver.ReadTimeout || s.IdleTimeout != httpserver.IdleTimeout {
		t.Fatalf("timeouts header %s read %s idle %s, want the defaults", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout)
	}
}
