package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// MITMOptions turns on TLS interception of CONNECT tunnels (Options.MITM).
type MITMOptions struct {
	// CA signs the per-host leaves; required.
	CA *mitmca.CA
	// Bypass are the hosts left as plain tunnels (pinned or mutual-TLS sites).
	Bypass HostPatterns
}

// mitmHello is the gateway's own answer to a CONNECT it intercepts.
var mitmHello = []byte("HTTP/1.1 200 Connection established\r\n" + HeaderMITM + ": on\r\n\r\n")

// mitm is the gateway's MITM side: a second net/http server that serves
// HTTP/1.1 from the clients' TLS connections, which the CONNECT handler
// hands to it once the handshake is done, so requests inside a tunnel get
// the server's keep-alive, framing and limits exactly as plain ones do.
type mitm struct {
	ca     *mitmca.CA
	bypass HostPatterns
	srv    *http.Server
	ln     *connListener
	served chan struct{}
}

// mitmTunnel is what a request inside an intercepted tunnel inherits from
// its CONNECT: the target and the client's parameters.
type mitmTunnel struct {
	p        params
	hostport string
	host     string
	port     uint16
}

type mitmTunnelKey struct{}

// mitmConn is a client's TLS connection with its tunnel. It is a wrapper,
// not the *tls.Conn itself, so net/http does not handshake again.
type mitmConn struct {
	net.Conn
	t *mitmTunnel
}

func (g *Gateway) newMITM(o *MITMOptions) (*mitm, error) {
	if o.CA == nil {
		return nil, errors.New("gateway: Options.MITM.CA is required")
	}
	m := &mitm{ca: o.CA, bypass: o.Bypass, ln: newConnListener(), served: make(chan struct{})}
	m.srv = &http.Server{
		Handler:           http.HandlerFunc(g.serveMITMRequest),
		ReadHeaderTimeout: serverReadHeader,
		IdleTimeout:       serverIdleTimeout,
		MaxHeaderBytes:    serverMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if mc, ok := c.(*mitmConn); ok {
				return context.WithValue(ctx, mitmTunnelKey{}, mc.t)
			}
			return ctx
		},
	}
	go func() {
		defer close(m.served)
		_ = m.srv.Serve(m.ln)
	}()
	return m, nil
}

// wanted reports whether a CONNECT to host is intercepted: not a bypassed
// host, and the client did not say X-Proxyfleet-Mitm: off.
func (m *mitm) wanted(r *http.Request, host string) bool {
	if v := r.Header[HeaderMITM]; len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "off") {
		return false
	}
	return !m.bypass.Match(host)
}

// serveMITM answers a checked CONNECT itself, terminates the client's TLS
// with a leaf for host, and hands the connection to the MITM server. No
// member is leased here: each request inside the tunnel leases (and may
// rotate) on its own, through the same path as plain HTTP.
func (g *Gateway) serveMITM(w http.ResponseWriter, r *http.Request, p *params, hostport, host string, port uint16, start time.Time) {
	rq := &request{w: w, start: start}
	rq.lr.target = rotation.HostKey(host) // the span's target; no lease is taken here
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		g.finish(r.Context(), rq, errors.New("cannot take over the connection: "+err.Error()))
		return
	}
	_ = conn.SetDeadline(time.Now().Add(g.dialTimeout))
	if _, err := conn.Write(mitmHello); err != nil {
		_ = conn.Close()
		g.ended(r.Context(), rq, OutcomeClientGone, "")
		return
	}
	var c net.Conn = conn
	if n := brw.Reader.Buffered(); n > 0 {
		// A ClientHello sent right behind the CONNECT.
		b, _ := brw.Reader.Peek(n)
		c = &prefixConn{Conn: conn, prefix: append([]byte(nil), b...)}
	}
	ca := g.mitm.ca
	tc := tls.Server(c, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The CONNECT authority names the site, whatever the SNI says
			// (IP literals have none): that is the host that was checked.
			return ca.LeafFor(host)
		},
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.dialTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		_ = tc.Close()
		msg := err.Error()
		if strings.Contains(msg, "unknown certificate authority") || strings.Contains(msg, "bad certificate") ||
			strings.Contains(msg, "certificate unknown") {
			g.log.Warn("a client refused the MITM certificate: does it trust the --mitm-ca-cert CA? (docs/mitm.md)", "target", host, "err", err)
		} else {
			g.log.Debug("MITM handshake with the client failed", "target", host, "err", err)
		}
		g.ended(r.Context(), rq, OutcomeClientGone, "")
		return
	}
	_ = tc.SetDeadline(time.Time{})
	t := &mitmTunnel{p: *p, hostport: hostport, host: host, port: port}
	if !g.mitm.ln.push(&mitmConn{Conn: tc, t: t}) {
		_ = tc.Close() // shutting down
	}
}

// serveMITMRequest serves one request from inside an intercepted tunnel:
// the site is the tunnel's, the parameters are the CONNECT's, and the rest
// is the plain-HTTP path (lease, retries, classification, delivery).
func (g *Gateway) serveMITMRequest(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rq := &request{w: w, start: start}
	t, ok := r.Context().Value(mitmTunnelKey{}).(*mitmTunnel)
	if !ok {
		g.finish(r.Context(), rq, errors.New("MITM request without its tunnel"))
		return
	}
	if r.Method == http.MethodConnect {
		g.finish(r.Context(), rq, &targetError{reason: ReasonBadRequest, msg: "CONNECT inside a MITM tunnel is not supported"})
		return
	}
	if r.URL.Host != "" {
		h, _, err := splitTarget(r.URL.Host, "443")
		if err != nil || !strings.EqualFold(h, t.host) || (r.URL.Scheme != "" && r.URL.Scheme != "https") {
			g.finish(r.Context(), rq, &targetError{reason: ReasonBadRequest,
				msg: "inside the MITM tunnel to " + echo.Quote(t.hostport) + " requests go to that site; got " + echo.Quote(r.URL.String())})
			return
		}
	}
	u := &url.URL{Scheme: "https", Host: t.hostport, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	g.forward(rq, r, &t.p, u, t.host, t.port)
}

// shutdown stops the MITM server as Shutdown does the main one.
func (m *mitm) shutdown(ctx context.Context) error {
	err := m.srv.Shutdown(ctx)
	if err != nil {
		_ = m.srv.Close()
	}
	<-m.served
	return err
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

func (l *connListener) Addr() net.Addr { return mitmAddr{} }

type mitmAddr struct{}

func (mitmAddr) Network() string { return "mitm" }
func (mitmAddr) String() string  { return "mitm" }
