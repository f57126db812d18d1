package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/internal/rawio"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// inner serves the requests that arrive inside a tunnel the gateway
// answered itself, a TLS connection it terminated (MITM) or plain HTTP
// carried in a CONNECT to an HTTP port, with the keep-alive, framing and
// limits plain requests get. A MITM'd tunnel whose client speaks HTTP/1.1
// goes to h1, the gateway's own HTTP/1.1 server (gateway/front), as the
// proxy port does: net/http's server starts a background read per request
// to notice a client that leaves, which parks and wakes a second goroutine
// and costs a read and two deadline changes each time (≈ 10 % of a MITM'd
// keep-alive request's CPU, measured with perf). A client that leaves
// while its request is with the site is then noticed when its answer is
// written, as on the proxy port; RequestTimeout bounds the wait.
// A port-80 tunnel goes to h1 too, so that its requests keep their
// client's header order and case (internal/fieldorder), which net/http's
// server loses. HTTP/2 (a MITM'd client that chose h2, and h2c with prior
// knowledge in a port-80 tunnel, which h1 hands over at its preface) is
// served by net/http's server, srv.
type inner struct {
	srv    *http.Server
	ln     *connListener
	served chan struct{}
	h1     *front.Server
}

// innerTunnel is what a request inside a tunnel inherits from its
// CONNECT: the target, the scheme it is spoken in and the client's
// parameters.
type innerTunnel struct {
	p        params.Params
	scheme   string // "https" (MITM) or "http"
	hostport string
	host     string
	port     uint16
	// Under MITM: fp is the tunnel's site-facing handshake; record the
	// client's ClientHello, parsed once a request mirrors it (helloFor).
	fp        Fingerprint
	record    []byte
	helloOnce sync.Once
	hello     *mirror.Hello // nil: the fallback preset
	// fb: the site handshake with the client's hello failed on the
	// gateway's side, and the tunnel goes on with a preset.
	fb helloFallback
	// lineage is the client's TLS session with the gateway (0: the client
	// got no ticket); resumed, whether this connection resumed it.
	lineage uint64
	resumed bool
	// speaksH2: the client speaks HTTP/2 to the gateway; h2 is what its
	// first frames said (h2Tap stores it before its first request reaches
	// a handler; nil when they could not be read).
	speaksH2 bool
	h2       atomic.Pointer[sitelink.H2Print]
	// sites are the tunnel's own site connections when it mirrors.
	sites sitelink.Links
}

type innerTunnelKey struct{}

// innerConn is a client's connection with its tunnel. It wraps a
// *tls.Conn under MITM, so net/http does not handshake again.
type innerConn struct {
	net.Conn
	t *innerTunnel
}

// Close closes the client's connection and the tunnel's site connections.
func (c *innerConn) Close() error {
	c.t.sites.CloseAll()
	return c.Conn.Close()
}

// newInner starts the inner servers: each request they read is handler's.
func newInner(handler http.HandlerFunc, fo front.Options, log *slog.Logger) *inner {
	in := &inner{ln: newConnListener(), served: make(chan struct{})}
	// HTTP/1.1, and HTTP/2 on a connection that starts with its preface:
	// under MITM the TLS is the gateway's, done before the connection is
	// handed over, so to the server HTTP/2 arrives as over plain TCP.
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	in.srv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: serverReadHeader,
		IdleTimeout:       serverIdleTimeout,
		MaxHeaderBytes:    serverMaxHeaderBytes,
		Protocols:         protos,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ic, ok := c.(*innerConn); ok {
				return context.WithValue(ctx, innerTunnelKey{}, ic.t)
			}
			return ctx
		},
	}
	go func() {
		defer close(in.served)
		_ = in.srv.Serve(in.ln)
	}()
	o := fo
	o.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, innerTunnelKey{}, c.(*innerConn).t)
	}
	o.HTTP2 = func(c net.Conn, read []byte) bool {
		// Prior knowledge is for plain HTTP only: a MITM'd client chose
		// its protocol in ALPN.
		ic, ok := c.(*innerConn)
		if !ok || ic.t.scheme != "http" {
			return false
		}
		return in.ln.push(&innerConn{Conn: &prefixConn{Conn: ic.Conn, prefix: read}, t: ic.t})
	}
	in.h1 = front.New(handler, o)
	return in
}

// serve hands c, the client's side of t, to the inner server that speaks
// its protocol; c is closed when the gateway is shutting down.
func (in *inner) serve(c net.Conn, t *innerTunnel) {
	ic := &innerConn{Conn: c, t: t}
	if !t.speaksH2 {
		go in.h1.ServeConn(ic)
		return
	}
	if !in.ln.push(ic) {
		_ = ic.Close()
	}
}

// shutdown stops the inner servers as Shutdown does the front end.
func (in *inner) shutdown(ctx context.Context) error {
	err := in.h1.Shutdown(ctx)
	if serr := in.srv.Shutdown(ctx); err == nil {
		err = serr
	}
	if err != nil {
		in.h1.Close()
		_ = in.srv.Close()
	}
	<-in.served
	return err
}

// carriesHTTP reports a CONNECT the gateway answers itself and reads as
// plain HTTP: to one of the HTTP ports, and not left alone by its client.
func (rp *requestPath) carriesHTTP(r *http.Request, port uint16) bool {
	return slices.Contains(rp.connectHTTPPorts, port) && !leftAlone(r)
}

// httpTunnelHello is the gateway's own answer to a CONNECT it reads as
// plain HTTP.
var httpTunnelHello = []byte("HTTP/1.1 200 Connection established\r\n\r\n")

// serveHTTPTunnel answers a checked CONNECT to an HTTP port itself and
// hands the connection to the inner server: each request in it (a
// WebSocket handshake, a GET) is leased, sent through a member in
// absolute form and judged as a plain request is. Bytes that are not
// HTTP get the server's 400 and the connection closed.
func (rp *requestPath) serveHTTPTunnel(w http.ResponseWriter, r *http.Request, p *params.Params, hostport, host string, port uint16, start time.Time) {
	rq := &request{w: w, start: start}
	rq.lr.target = rotation.HostKey(host) // the span's target; no lease is taken here
	c, ok := rp.takeTunnel(w, r, rq, httpTunnelHello, false)
	if !ok {
		return
	}
	_ = c.SetDeadline(time.Time{})
	rp.inner.serve(c, &innerTunnel{p: *p, scheme: "http", hostport: hostport, host: host, port: port})
}

// takeTunnel takes over the client's connection of a CONNECT the gateway
// answers itself, writes hello, and returns the connection with any bytes
// the client sent behind its CONNECT put back (a ClientHello, a request).
// Its deadline is the dial timeout, for what the caller does next; false
// when the client is gone (the outcome is recorded). With raw the
// connection reads and writes through internal/rawio (no runtime system
// call each): a MITM'd tunnel's TLS records, which nothing splices; a
// port-80 tunnel keeps its *net.TCPConn, which a WebSocket upgraded inside
// it splices.
func (rp *requestPath) takeTunnel(w http.ResponseWriter, r *http.Request, rq *request, hello []byte, raw bool) (net.Conn, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rp.exit.finish(r.Context(), rq, errors.New("cannot take over the connection: "+err.Error()))
		return nil, false
	}
	if raw {
		conn = rawio.Wrap(conn)
	}
	_ = conn.SetDeadline(time.Now().Add(rp.dialTimeout))
	if _, err := conn.Write(hello); err != nil {
		_ = conn.Close()
		rp.exit.ended(r.Context(), rq, fault.OutcomeClientGone, "")
		return nil, false
	}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		return &prefixConn{Conn: conn, prefix: append([]byte(nil), b...)}, true
	}
	return conn, true
}

// innerSchemes are the schemes a request line inside a tunnel may name,
// by the tunnel's scheme (a WebSocket client may write ws:// or wss://).
var innerSchemes = map[string][]string{"https": {"https", "wss"}, "http": {"http", "ws"}}

// serveInnerRequest serves one request from inside a tunnel the gateway
// answered: the site is the tunnel's, the parameters are the CONNECT's,
// and the rest is the plain-HTTP path (lease, retries, classification,
// delivery).
func (rp *requestPath) serveInnerRequest(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rq := &request{w: w, start: start}
	t, ok := r.Context().Value(innerTunnelKey{}).(*innerTunnel)
	if !ok {
		rp.exit.finish(r.Context(), rq, errors.New("request without its tunnel"))
		return
	}
	if r.Method == http.MethodConnect {
		rp.exit.finish(r.Context(), rq, &fault.Target{Reason: fault.ReasonBadRequest, Msg: "CONNECT inside a tunnel the gateway answered is not supported"})
		return
	}
	if r.URL.Host != "" {
		defPort := "443"
		if t.scheme == "http" {
			defPort = "80"
		}
		// Host and port: another port of the same host is another site.
		h, port, err := sites.SplitTarget(r.URL.Host, defPort)
		if err != nil || !strings.EqualFold(h, t.host) || port != t.port || (r.URL.Scheme != "" && !slices.Contains(innerSchemes[t.scheme], r.URL.Scheme)) {
			rp.exit.finish(r.Context(), rq, &fault.Target{Reason: fault.ReasonBadRequest,
				Msg: "inside the tunnel to " + echo.Quote(t.hostport) + " requests go to that site; got " + echo.Quote(r.URL.String())})
			return
		}
	}
	if t.scheme == "https" {
		fp, err := fingerprintOf(r.Header, t.fp)
		if err != nil {
			rp.exit.finish(r.Context(), rq, err)
			return
		}
		if fp == FingerprintMirror {
			rq.mirror = t
		}
	}
	u := &url.URL{Scheme: t.scheme, Host: t.hostport, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	rp.forward(rq, r, &t.p, u, t.host, t.port)
}

// prefixConn is a connection with bytes already read from it put back.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// connListener is a net.Listener whose connections are pushed to it.
type connListener struct {
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

// push hands c to Accept; false when the listener is closed.
func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return innerAddr{} }

type innerAddr struct{}

func (innerAddr) Network() string { return "tunnel" }
func (innerAddr) String() string  { return "tunnel" }
