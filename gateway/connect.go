package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/gateway/relay"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// serveConnect opens a tunnel through a leased member, retrying on other
// members while the tunnel is not up, then splices bytes both ways.
func (rp *requestPath) serveConnect(w http.ResponseWriter, r *http.Request, p *params.Params, start time.Time) {
	ctx := r.Context()
	rq := &request{w: w, start: start}
	hostport := r.Host
	if r.RequestURI != hostport {
		// net/http read the authority as a URL and kept only its host:
		// a login, a path, a query or an escape was dropped, not refused.
		// The target is not quoted: a login may be in it.
		rp.exit.finish(ctx, rq, &fault.Target{Reason: fault.ReasonBadRequest,
			Msg: "a CONNECT target is host:port, nothing else (no login, path, query or %-escape)"})
		return
	}
	host, port, err := sites.SplitTarget(hostport, "")
	if err == nil {
		err = checkMITMHeader(r)
	}
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	addrs, err := rp.admit.CheckTarget(ctx, host, port)
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	if rp.carriesHTTP(r, port) {
		rp.serveHTTPTunnel(w, r, p, hostport, host, port, start)
		return
	}
	if rp.mitm != nil && rp.mitm.wanted(r, host) {
		rp.serveMITM(w, r, p, hostport, host, port, start)
		return
	}
	rq.lr = rp.leases.newReq(p, rotation.HostKey(host))
	up, early, err := rp.openTunnel(ctx, rq, hostport, host, port, addrs)
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	rp.runTunnel(ctx, w, rq, up, early, "200 Connection established", nil)
}

// runTunnel takes over the client's connection for the tunnel up carries
// (early: bytes the upstream sent behind its answer), answers status with
// header and the gateway's own headers, and starts the relays; the lease
// rq holds ends with the tunnel. A CONNECT and an upgraded WebSocket end
// here alike.
func (rp *requestPath) runTunnel(ctx context.Context, w http.ResponseWriter, rq *request, up net.Conn, early []byte, status string, header http.Header) {
	t := relay.New(up)
	if !rp.tunnels.Add(t) {
		_ = up.Close()
		rp.exit.finish(ctx, rq, errShuttingDown)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Close()
		rp.tunnels.Remove(t)
		rp.exit.finish(ctx, rq, errors.New("cannot take over the connection: "+err.Error()))
		return
	}
	if !t.SetClient(conn) {
		rp.tunnels.Remove(t)
		rp.exit.finish(ctx, rq, fault.ErrClientGone)
		return
	}
	_ = conn.SetDeadline(time.Time{})

	h := rq.h
	head := make([]byte, 0, 128+len(rq.member)+len(h.id))
	head = append(head, "HTTP/1.1 "...)
	head = append(head, status...)
	head = append(head, "\r\n"...)
	for k, vv := range header {
		for _, v := range vv {
			head = appendHeader(head, k, v)
		}
	}
	head = appendHeader(head, HeaderProxy, rq.member)
	head = appendHeader(head, HeaderLease, h.id)
	head = appendHeader(head, HeaderAttempts, attemptsValue(rq.attempts)[0])
	if t := rp.tiers.Header(h.mc.Member.Attributes); t != nil {
		head = appendHeader(head, HeaderTier, t[0])
	}
	head = append(head, "\r\n"...)
	var upN, downN int64
	if _, err := conn.Write(head); err != nil {
		t.Close()
		rp.tunnels.Remove(t)
		rp.exit.finish(ctx, rq, fault.ErrClientGone)
		return
	}
	rp.exit.ended(ctx, rq, fault.OutcomeOK, "")
	// Bytes the client sent right behind its CONNECT (an optimistic TLS
	// ClientHello) sit in the server's reader; bytes the upstream sent right
	// behind its 200 sit in early. Both go first.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			t.Close()
		}
		upN += int64(n)
	}
	if len(early) > 0 {
		if _, err := conn.Write(early); err != nil {
			t.Close()
		}
		downN += int64(len(early))
	}
	// The tunnel runs on fresh goroutines and this handler returns, so the
	// connection's buffers and the handler's stack are freed; once idle,
	// its directions give their goroutines up too (gateway/relay), and an
	// idle tunnel costs its two sockets.
	ctx = context.WithoutCancel(ctx)
	t.Start(&rp.bufs, rp.tunnelIdle, func(up, down int64) {
		rp.tunnels.Remove(t)
		rp.relayed(ctx, rq.lr.p.Client, upN+up, downN+down)
		rp.leases.done(ctx, h) // per-request rotation ends the lease here
	})
}

// openTunnel is CONNECT on the one retry loop (tryMembers): dial through a
// member, trying others while the tunnel is not up, until it is (rq then
// holds its lease) or the error that ends the request.
func (rp *requestPath) openTunnel(ctx context.Context, rq *request, hostport, host string, port uint16, addrs []netip.Addr) (net.Conn, []byte, error) {
	at := attempts{hostport: hostport}
	answerTimeout := rp.ex.answerTimeoutFor(rq.lr.target)
	// A tunnel is one request to the site, in flight while it opens.
	defer rq.leavePace(rp.pacer)
	var (
		up    net.Conn
		early []byte
	)
	err := rp.tryMembers(ctx, ctx, rq, &at, retryRule{retryable: true, maxRetries: -1}, func(h held, _ int) (served, error) {
		var err error
		up, early, err = rp.ex.tunnel(ctx, h.mc, hostport, host, port, addrs, answerTimeout)
		switch {
		case err == nil:
			return servedHere, nil
		case ctx.Err() != nil:
			return tryAnother, fault.ErrClientGone
		}
		return tryAnother, fault.AsAttempt(err)
	})
	return up, early, err
}

// appendHeader appends "name: value\r\n", replacing control characters in
// value so a member name can never split the response head.
func appendHeader(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c < 0x20 || c == 0x7f {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, "\r\n"...)
}
