// Package httpserver makes the http.Servers of proxyfleet's own HTTP
// endpoints: the lease API, the metrics and status pages of both
// commands, and the controller's injection webhook. It is the one place
// their timeouts are set, so that no endpoint is left with a header
// timeout only: a client that sends its headers, announces a body and
// then trickles it (or sends nothing more) would otherwise hold its
// connection, and a file descriptor, for ever, and some thousands of
// such clients take the process's descriptors and with them the proxy
// port. It is not for the proxy port itself (package gateway bounds its
// own connections, which carry tunnels of any length).
package httpserver

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/logging"
)

// The default timeouts. Every request these servers take is small (a
// lease API body is at most 64 KiB, a status or metrics request has
// none) and every client is a program or a person on a near network, so
// the bounds are far above what a working client needs and short
// enough that a stalled one cannot pile up.
const (
	// ReadHeaderTimeout bounds reading a request's head.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request, head and body: a client
	// that announced a body and stalls is cut off after it.
	ReadTimeout = 30 * time.Second
	// IdleTimeout is how long a kept-alive connection may wait for its
	// next request. Gateways on --lease-api and Prometheus come back
	// every few seconds, well within it; a connection nobody uses is
	// closed instead of being held by an idle or absent client.
	IdleTimeout = 2 * time.Minute
)

// Timeouts override the defaults; a zero field is its default. Tests
// shrink them; commands leave them zero.
type Timeouts struct {
	ReadHeader, Read, Idle time.Duration
}

// New is an http.Server for h with the timeouts t (zero fields: the
// defaults above) and log as its error log (nil: net/http's own). No
// WriteTimeout is set: a slow reader of an answer is bounded by the
// kernel's send buffer and the handler's own context, and a status page
// or metrics scrape of a large fleet may take a while to write.
func New(h http.Handler, log *slog.Logger, t Timeouts) *http.Server {
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(t.ReadHeader, ReadHeaderTimeout),
		ReadTimeout:       or(t.Read, ReadTimeout),
		IdleTimeout:       or(t.Idle, IdleTimeout),
	}
	if log != nil {
		s.ErrorLog = logging.ServerErrorLog(log)
	}
	return s
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
