package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/admission"
	"github.com/proxyfleet/proxyfleet/gateway/health"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/relay"
	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// requestPath is the gateway's request path: one function per protocol,
// each the list of the stages it runs, in order.
//
//	plain HTTP    serve → serveForward → forward: admission (target, body read ahead) → forwardWithRetry
//	CONNECT       serve → serveConnect: admission (target) → openTunnel → runTunnel
//	MITM / port 80  serveConnect → serveMITM / serveHTTPTunnel → (each request inside) serveInnerRequest → forward
//	WebSocket     forward → serveUpgrade → runTunnel
//
// Every protocol's attempts run on the one retry loop (tryMembers: the
// tier the request starts on → leasing → pacing → one exchange over a member link → judge → member
// health), and every request ends in the finisher. The path holds the
// stages and the settings of the protocols themselves; the stages hold
// their own state and call no later stage except through the interface
// they were given.
type requestPath struct {
	admit  *admission.Admission
	leases *leasing
	pacer  *pacing.Pacer
	tiers  *tiering.Tiering // nil: one tier
	ex     *exchange
	health *health.Health
	exit   *finisher
	inner  *inner // the servers inside tunnels the gateway answers itself
	mitm   *mitm  // nil: a CONNECT to a TLS port is a plain tunnel

	retries        int
	classifier     rotation.Classifier
	requestTimeout time.Duration
	dialTimeout    time.Duration
	tunnelIdle     time.Duration
	// connectHTTPPorts: see Options.ConnectHTTPPorts.
	connectHTTPPorts []uint16

	tunnels relay.Set
	bufs    relay.Bufs
	rec     Recorder
	log     *slog.Logger
}

// relayed counts what one relayed answer or tunnel carried, once, at its
// end: the bytes metric per direction and the token client's day of bytes
// (its quota). Every byte count of the path is made here, so another
// account of bytes (cost per tier) is one more line, not one per protocol.
func (rp *requestPath) relayed(ctx context.Context, client string, up, down int64) {
	if up > 0 {
		rp.rec.BytesRelayed(DirectionUp, up)
	}
	rp.rec.BytesRelayed(DirectionDown, down)
	rp.leases.quota.spent(ctx, client, up+down)
}

// serve handles one proxy request: CONNECT or an absolute-URI HTTP request.
func (rp *requestPath) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	p, err := rp.admit.Authenticate(r)
	if err != nil {
		rp.exit.finish(r.Context(), &request{w: w, start: start}, err)
		return
	}
	if r.Method == http.MethodConnect {
		rp.serveConnect(w, r, &p, start)
		return
	}
	rp.serveForward(w, r, &p, start)
}
