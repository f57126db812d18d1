package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/gateway/socks5"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// maxConnectAnswer bounds an upstream's answer head to our CONNECT.
const maxConnectAnswer = 64 << 10

// serveConnect opens a tunnel through a leased member, retrying on other
// members while the tunnel is not up, then splices bytes both ways.
func (g *Gateway) serveConnect(w http.ResponseWriter, r *http.Request, p *params.Params, start time.Time) {
	ctx := r.Context()
	rq := &request{w: w, start: start}
	hostport := r.Host
	if r.RequestURI != hostport {
		// net/http read the authority as a URL and kept only its host:
		// a login, a path, a query or an escape was dropped, not refused.
		// The target is not quoted: a login may be in it.
		g.finish(ctx, rq, &targetError{reason: ReasonBadRequest,
			msg: "a CONNECT target is host:port, nothing else (no login, path, query or %-escape)"})
		return
	}
	host, port, err := splitTarget(hostport, "")
	if err == nil {
		err = checkMITMHeader(r)
	}
	if err != nil {
		g.finish(ctx, rq, err)
		return
	}
	addrs, err := g.checkTarget(ctx, host, port)
	if err != nil {
		g.finish(ctx, rq, err)
		return
	}
	if g.carriesHTTP(r, port) {
		g.serveHTTPTunnel(w, r, p, hostport, host, port, start)
		return
	}
	if g.mitm != nil && g.mitm.wanted(r, host) {
		g.serveMITM(w, r, p, hostport, host, port, start)
		return
	}
	rq.lr = g.leases.newReq(p, rotation.HostKey(host))
	up, early, err := g.openTunnel(ctx, rq, hostport, host, port, addrs)
	if err != nil {
		g.finish(ctx, rq, err)
		return
	}
	g.runTunnel(ctx, w, rq, up, early, "200 Connection established", nil)
}

// runTunnel takes over the client's connection for the tunnel up carries
// (early: bytes the upstream sent behind its answer), answers status with
// header and the gateway's own headers, and starts the relays; the lease
// rq holds ends with the tunnel. A CONNECT and an upgraded WebSocket end
// here alike.
func (g *Gateway) runTunnel(ctx context.Context, w http.ResponseWriter, rq *request, up net.Conn, early []byte, status string, header http.Header) {
	t := &tunnel{upstream: up}
	if !g.tunnels.add(t) {
		_ = up.Close()
		g.finish(ctx, rq, errShuttingDown)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.close()
		g.tunnels.remove(t)
		g.finish(ctx, rq, errors.New("cannot take over the connection: "+err.Error()))
		return
	}
	if !t.setClient(conn) {
		g.tunnels.remove(t)
		g.finish(ctx, rq, errClientGone)
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
	head = append(head, "\r\n"...)
	var upN, downN int64
	if _, err := conn.Write(head); err != nil {
		t.close()
		g.tunnels.remove(t)
		g.finish(ctx, rq, errClientGone)
		return
	}
	g.ended(ctx, rq, OutcomeOK, "")
	// Bytes the client sent right behind its CONNECT (an optimistic TLS
	// ClientHello) sit in the server's reader; bytes the upstream sent right
	// behind its 200 sit in early. Both go first.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			t.close()
		}
		upN += int64(n)
	}
	if len(early) > 0 {
		if _, err := conn.Write(early); err != nil {
			t.close()
		}
		downN += int64(len(early))
	}
	// The tunnel runs on fresh goroutines and this handler returns, so the
	// connection's buffers and the handler's stack are freed; once idle,
	// its directions give their goroutines up too (park_linux.go), and an
	// idle tunnel costs its two sockets.
	ctx = context.WithoutCancel(ctx)
	t.start(&g.bufs, g.tunnelIdle, func(up, down int64) {
		g.tunnels.remove(t)
		g.rec.BytesRelayed(DirectionUp, upN+up)
		g.rec.BytesRelayed(DirectionDown, downN+down)
		g.leases.done(ctx, h) // per-request rotation ends the lease here
	})
}

// openTunnel is CONNECT on the one retry loop (tryMembers): dial through a
// member, trying others while the tunnel is not up, until it is (rq then
// holds its lease) or the error that ends the request.
func (g *Gateway) openTunnel(ctx context.Context, rq *request, hostport, host string, port uint16, addrs []netip.Addr) (net.Conn, []byte, error) {
	at := attempts{hostport: hostport}
	answerTimeout := g.answerTimeoutFor(rq.lr.target)
	// A tunnel is one request to the site, in flight while it opens.
	defer g.leavePace(rq)
	var (
		up    net.Conn
		early []byte
	)
	err := g.tryMembers(ctx, ctx, rq, &at, retryRule{retryable: true, maxRetries: -1}, func(h held, _ int) (served, error) {
		var err error
		up, early, err = g.dialConnect(ctx, h.mc, hostport, host, port, addrs, answerTimeout)
		switch {
		case err == nil:
			return servedHere, nil
		case ctx.Err() != nil:
			return tryAnother, errClientGone
		}
		return tryAnother, asAttempt(err)
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

// dialConnect opens a connection that carries bytes to hostport through mc:
// a direct dial from the member's source address to a checked address, a
// SOCKS5 CONNECT, or an HTTP CONNECT to an http(s) upstream whose answer
// must be 2xx. early holds bytes the upstream sent behind its answer.
//
// Every failure leaves here classified (an *attemptError): reaching the
// member, its handshakes and a garbled answer are the member's fault; what
// the member answered about the site, and a member that took our CONNECT
// but did not answer within answerTimeout (it is waiting on the site, or
// it is dead: checkAlive tells), are the site's.
func (g *Gateway) dialConnect(ctx context.Context, mc *memberConn, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (c net.Conn, early []byte, err error) {
	dctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
	defer cancel()
	if mc.m.URL == nil {
		c, err = g.dialDirect(dctx, mc, host, port, addrs)
		return c, nil, classifyDirect(err)
	}
	if c, err = g.dialMember(dctx, mc); err != nil {
		return nil, nil, err
	}
	// The client leaving aborts any step: a deadline in the past ends the
	// I/O. answerTimeout bounds the member's answer (a SOCKS5 reply comes
	// once the member reached the site too).
	// The function gets the connection, not c: on a failure the deferred
	// function below sets c to nil, perhaps while the function runs.
	conn := c
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(keepalive.ALongTimeAgo) })
	defer func() {
		if !stop() || err != nil {
			if c != nil {
				_ = c.Close()
			}
			c, early = nil, nil
			if err == nil {
				err = memberFault("timeout", ctx.Err())
			}
			return
		}
		// The tunnel is up: its bytes flow without a deadline.
		_ = c.SetDeadline(time.Time{})
	}()
	_ = c.SetDeadline(time.Now().Add(answerTimeout))
	if ctx.Err() != nil {
		_ = c.SetDeadline(keepalive.ALongTimeAgo) // an abort the line above undid
	}
	if mc.socks5 {
		err = socks5.Connect(c, mc.m.URL.User, host, port)
		var re *socks5.ReplyError
		switch {
		case err == nil:
		case errors.As(err, &re):
			err = &attemptError{f: rotation.SOCKSReply(re.Code), err: err}
		case isTimeout(err) && ctx.Err() == nil:
			err = answerTimedOut(answerTimeout, "SOCKS5 CONNECT")
		}
		return c, nil, err
	}
	early, err = g.connectExchange(ctx, c, mc, hostport, answerTimeout)
	return c, early, err
}

// dialMember connects to the proxy member mc itself, TLS included for an
// https:// member, within ctx; its failures are the member's.
func (g *Gateway) dialMember(ctx context.Context, mc *memberConn) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", mc.upstreamAddr)
	if err != nil {
		return nil, memberFault("dial", err)
	}
	if mc.tlsConfig == nil {
		return c, nil
	}
	tc := tls.Client(c, mc.tlsConfig)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, memberFault("tls", errors.New("TLS to upstream: "+err.Error()))
	}
	return tc, nil
}

// connectExchange sends our CONNECT for hostport on c, a connection to the
// http(s) member mc, and reads its answer, which must be 2xx; early holds
// bytes the member sent behind it. c's deadline bounds the answer.
func (g *Gateway) connectExchange(ctx context.Context, c net.Conn, mc *memberConn, hostport string, answerTimeout time.Duration) (early []byte, err error) {
	req := make([]byte, 0, 64+2*len(hostport)+len(mc.proxyAuth))
	req = append(req, "CONNECT "...)
	req = append(req, hostport...)
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, hostport...)
	req = append(req, "\r\n"...)
	if mc.proxyAuth != "" {
		req = append(req, "Proxy-Authorization: "...)
		req = append(req, mc.proxyAuth...)
		req = append(req, "\r\n"...)
	}
	req = append(req, "\r\n"...)
	if _, err = c.Write(req); err != nil {
		return nil, memberFault("write", err)
	}
	br := g.readers.Get(c)
	defer g.readers.Put(br)
	status, line, ue, err := readConnectAnswer(br)
	if err != nil {
		if errors.Is(err, errNoAnswerYet) && ctx.Err() == nil {
			// The member took the CONNECT and is still working on it:
			// Squid answers only once it reached the site (or gave up).
			return nil, answerTimedOut(answerTimeout, "CONNECT")
		}
		return nil, memberFault("protocol", err)
	}
	if status < 200 || status > 299 {
		ae := &answerError{status: status, line: line, ue: ue, connect: true}
		return nil, &attemptError{f: rotation.UpstreamAnswer(status, ue), err: ae}
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		early = append([]byte(nil), b...)
	}
	return early, nil
}

// errNoAnswerYet: the read deadline passed before the first byte of an
// answer to CONNECT.
var errNoAnswerYet = errors.New("no answer to CONNECT yet")

// isTimeout reports a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readConnectAnswer reads an HTTP/1.x answer head and returns its status.
// A 2xx means the tunnel is up and its headers are skipped; a failure's
// error headers are kept, since they say whose failure it was.
func readConnectAnswer(br *bufio.Reader) (int, string, rotation.UpstreamError, error) {
	total := 0
	first := true
	status := 0
	line := ""
	var ue rotation.UpstreamError
	for {
		b, err := br.ReadSlice('\n')
		total += len(b)
		if total > maxConnectAnswer {
			return 0, "", ue, errors.New("upstream answer head larger than " + strconv.Itoa(maxConnectAnswer) + " bytes")
		}
		if err == bufio.ErrBufferFull {
			if first {
				return 0, "", ue, errors.New("upstream answer status line too long")
			}
			continue
		}
		if err != nil {
			if first && total == 0 && isTimeout(err) {
				return 0, "", ue, errNoAnswerYet
			}
			if first {
				return 0, "", ue, errors.New("no answer to CONNECT: " + err.Error())
			}
			return 0, "", ue, errors.New("truncated answer to CONNECT: " + err.Error())
		}
		if first {
			first = false
			s := string(trimEOL(b))
			if len(s) < 12 || s[:7] != "HTTP/1." || s[8] != ' ' {
				return 0, "", ue, errors.New("malformed answer to CONNECT: " + echo.Quote(s))
			}
			n, err := strconv.Atoi(s[9:12])
			if err != nil || n < 100 || n > 999 || (len(s) > 12 && s[12] != ' ') {
				return 0, "", ue, errors.New("malformed answer to CONNECT: " + echo.Quote(s))
			}
			status, line = n, echo.Quote(s[9:])
			continue
		}
		h := trimEOL(b)
		if len(h) == 0 {
			if status >= 100 && status < 200 {
				// An interim answer; the real one follows.
				first = true
				continue
			}
			return status, line, ue, nil
		}
		if status < 200 || status > 299 {
			readErrorHeader(&ue, h)
		}
	}
}

// readErrorHeader keeps h when it is one of the error headers proxies put
// on answers they make themselves.
func readErrorHeader(ue *rotation.UpstreamError, h []byte) {
	name, value, ok := strings.Cut(string(h), ":")
	if !ok {
		return
	}
	value = strings.TrimSpace(value)
	switch {
	case strings.EqualFold(name, "Proxy-Status"):
		ue.ProxyStatus = value
	case strings.EqualFold(name, "X-Squid-Error"):
		ue.SquidError = value
	case strings.EqualFold(name, "X-Brd-Err-Code"):
		ue.BrightDataCode = value
	}
}

// upstreamErrorOf reads the same headers from a plain-HTTP answer.
func upstreamErrorOf(h http.Header) rotation.UpstreamError {
	var ue rotation.UpstreamError
	if v := h["Proxy-Status"]; len(v) > 0 {
		ue.ProxyStatus = strings.Join(v, ", ")
	}
	if v := h["X-Squid-Error"]; len(v) > 0 {
		ue.SquidError = v[0]
	}
	if v := h["X-Brd-Err-Code"]; len(v) > 0 {
		ue.BrightDataCode = v[0]
	}
	return ue
}

// classifyDirect gives a direct member's dial failure its verdict: the
// member's own when its source address is gone or out of ports, else the
// site's, firsthand.
func classifyDirect(err error) error {
	if err == nil {
		return nil
	}
	var te *targetError
	if errors.As(err, &te) {
		return err
	}
	if directMemberFault(err) {
		return memberFault("source address", err)
	}
	return &attemptError{f: rotation.Site("connect"), err: err, firsthand: true}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}
