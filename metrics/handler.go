package metrics

import (
	"errors"
	"net/http"
	"sync/atomic"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// Readiness is the process's serving state for /readyz: not ready until the
// listeners are up, not ready again once shutdown begins, so a load balancer
// drains the process before it stops accepting. The zero value is "starting".
type Readiness struct {
	state atomic.Int32
}

const (
	stateStarting int32 = iota
	stateServing
	stateStopping
)

// Serving marks the process ready.
func (r *Readiness) Serving() { r.state.Store(stateServing) }

// Stopping marks the process as shutting down; it never becomes ready again.
func (r *Readiness) Stopping() { r.state.Store(stateStopping) }

// Ready returns nil while serving, and an error saying why not otherwise.
func (r *Readiness) Ready() error {
	switch r.state.Load() {
	case stateServing:
		return nil
	case stateStopping:
		return errors.New("shutting down")
	default:
		return errors.New("starting")
	}
}

// Handler serves /metrics from g, /healthz (200 while the process runs) and
// /readyz (200 when ready returns nil, else 503 with its error). Any other
// path is a 404.
func Handler(g prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", prometheus.HandlerFor(g, prometheus.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: " + err.Error() + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
