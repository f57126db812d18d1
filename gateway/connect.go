package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// maxConnectAnswer bounds an upstream's answer head to our CONNECT.
const maxConnectAnswer = 64 << 10

// answerError is an upstream that is up but answered our CONNECT with a
// non-2xx status. Squid answers that way both for its own trouble and for
// a target it will not or cannot reach, so such failures are retried on
// other members only up to Options.Retries times (a dial failure is retried
// while members remain): a client asking for an unreachable target must not
// be able to take the whole pool out of service.
type answerError struct {
	status int
	line   string
}

func (e *answerError) Error() string { return "answered CONNECT with " + e.line }

// serveConnect opens a tunnel through a leased member, retrying on other
// members while the tunnel is not up, then splices bytes both ways.
func (g *Gateway) serveConnect(w http.ResponseWriter, r *http.Request, p *Params, start time.Time) {
	ctx := r.Context()
	hostport := r.Host
	host, port, err := splitTarget(hostport, "")
	if err != nil {
		g.targetFail(w, err, start)
		return
	}
	addrs, err := g.checkTarget(ctx, host, port)
	if err != nil {
		g.targetFail(w, err, start)
		return
	}
	lr := g.newLeaseReq(p, rotation.HostKey(host))

	var (
		h        held
		up       net.Conn
		early    []byte
		tried    []string
		lastErr  error
		lastName string
		answered int
	)
	for {
		h, err = g.acquire(ctx, &lr)
		if err != nil {
			if ctx.Err() != nil {
				g.rec.Request(lastName, OutcomeClientError, time.Since(start))
				return
			}
			if lastErr == nil {
				g.rec.Request("", g.poolError(w, &lr, err), time.Since(start))
				return
			}
			g.fail(w, http.StatusBadGateway, "upstream_failed",
				"upstream "+lastName+" "+lastErr.Error()+"; no other member: "+err.Error())
			g.rec.Request(lastName, OutcomeUpstreamFailed, time.Since(start))
			return
		}
		name := h.mc.m.Name
		if slices.Contains(tried, name) {
			// The pool offered a member that already failed this request
			// (its failure window did not apply, e.g. a remote report was lost).
			// Unpin it too, so the session's next tunnel asks the pool again.
			g.release(ctx, &lr, h)
			g.fail(w, http.StatusBadGateway, "upstream_failed", "upstream "+lastName+" "+lastErr.Error())
			g.rec.Request(lastName, OutcomeUpstreamFailed, time.Since(start))
			return
		}
		up, early, err = g.dialConnect(ctx, h.mc, hostport, host, port, addrs)
		if err == nil {
			break
		}
		var te *targetError
		if errors.As(err, &te) {
			g.done(ctx, h)
			g.targetFail(w, te, start)
			return
		}
		if ctx.Err() != nil {
			g.done(ctx, h)
			g.rec.Request(name, OutcomeClientError, time.Since(start))
			return
		}
		if h.mc.m.Direct() && !directMemberFault(err) {
			// The site itself is unreachable; another egress address would
			// not help and this one is fine.
			g.done(ctx, h)
			g.fail(w, http.StatusBadGateway, "target_unreachable", "cannot reach "+quote(hostport)+" from "+name+": "+err.Error())
			g.rec.Request(name, OutcomeUpstreamFailed, time.Since(start))
			return
		}
		g.log.Debug("CONNECT through member failed", "member", name, "target", lr.target, "err", err)
		g.drop(ctx, &lr, h, rotation.ResultUpstreamFailed, 0)
		tried = append(tried, name)
		lastErr, lastName = err, name
		var ae *answerError
		if errors.As(err, &ae) && ae.status != http.StatusProxyAuthRequired {
			answered++
			if answered > g.retries {
				g.fail(w, http.StatusBadGateway, "upstream_failed", "upstream "+name+" "+err.Error())
				g.rec.Request(name, OutcomeUpstreamFailed, time.Since(start))
				return
			}
		}
	}

	name := h.mc.m.Name
	t := &tunnel{upstream: up}
	if !g.tunnels.add(t) {
		_ = up.Close()
		g.done(ctx, h)
		g.fail(w, http.StatusServiceUnavailable, "shutting_down", "gateway is shutting down")
		g.rec.Request(name, OutcomeClientError, time.Since(start))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.close()
		g.tunnels.remove(t)
		g.done(ctx, h)
		g.fail(w, http.StatusInternalServerError, "internal", "cannot take over the connection: "+err.Error())
		g.rec.Request(name, OutcomeClientError, time.Since(start))
		return
	}
	if !t.setClient(conn) {
		g.tunnels.remove(t)
		g.done(ctx, h)
		return
	}
	_ = conn.SetDeadline(time.Time{})

	head := make([]byte, 0, 96+len(name)+len(h.id))
	head = append(head, "HTTP/1.1 200 Connection established\r\n"...)
	head = appendHeader(head, HeaderProxy, name)
	head = appendHeader(head, HeaderLease, h.id)
	head = append(head, "\r\n"...)
	var upN, downN int64
	if _, err := conn.Write(head); err != nil {
		t.close()
		g.tunnels.remove(t)
		g.done(ctx, h)
		g.rec.Request(name, OutcomeClientError, time.Since(start))
		return
	}
	g.rec.Request(name, OutcomeOK, time.Since(start))
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
	// The tunnel runs on fresh goroutines and this handler returns, so
	// net/http frees the connection's buffers and the handler's stack:
	// an idle tunnel costs two small goroutine stacks and two sockets.
	go g.runTunnel(context.WithoutCancel(ctx), t, h, upN, downN)
}

// runTunnel splices an established tunnel until both sides are done, then
// records its bytes and ends its lease (per-request rotation).
func (g *Gateway) runTunnel(ctx context.Context, t *tunnel, h held, upN, downN int64) {
	defer g.tunnels.remove(t)
	u, d := splice(&g.bufs, t)
	g.rec.BytesRelayed(DirectionUp, upN+u)
	g.rec.BytesRelayed(DirectionDown, downN+d)
	g.done(ctx, h)
}

// targetFail answers a refused or malformed target.
func (g *Gateway) targetFail(w http.ResponseWriter, err error, start time.Time) {
	var te *targetError
	if !errors.As(err, &te) {
		te = &targetError{status: http.StatusBadGateway, reason: "upstream_failed", msg: err.Error()}
	}
	g.fail(w, te.status, te.reason, te.msg)
	outcome := OutcomeDenied
	switch te.status {
	case http.StatusBadRequest:
		outcome = OutcomeBadRequest
	case http.StatusBadGateway:
		outcome = OutcomeUpstreamFailed
	}
	g.rec.Request("", outcome, time.Since(start))
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
func (g *Gateway) dialConnect(ctx context.Context, mc *memberConn, hostport, host string, port uint16, addrs []netip.Addr) (c net.Conn, early []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
	defer cancel()
	if mc.m.URL == nil {
		c, err = g.dialDirect(ctx, mc, host, port, addrs)
		return c, nil, err
	}
	var d net.Dialer
	c, err = d.DialContext(ctx, "tcp", mc.upstreamAddr)
	if err != nil {
		return nil, nil, err
	}
	// ctx (DialTimeout, or the client leaving) bounds the TLS handshake and
	// the CONNECT exchange: when it ends, a deadline in the past aborts the
	// I/O. No deadline is set otherwise, so none needs clearing after.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	defer func() {
		if !stop() || err != nil {
			if c != nil {
				_ = c.Close()
			}
			c, early = nil, nil
			if err == nil {
				err = ctx.Err()
			}
		}
	}()
	if mc.socks5 {
		err = socks5Connect(c, mc.m.URL.User, host, port)
		return c, nil, err
	}
	if mc.tlsConfig != nil {
		tc := tls.Client(c, mc.tlsConfig)
		if err = tc.HandshakeContext(ctx); err != nil {
			return c, nil, errors.New("TLS to upstream: " + err.Error())
		}
		c = tc
	}
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
		return c, nil, err
	}
	br := g.readers.get(c)
	defer g.readers.put(br)
	status, line, err := readConnectAnswer(br)
	if err != nil {
		return c, nil, err
	}
	if status < 200 || status > 299 {
		return c, nil, &answerError{status: status, line: line}
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		early = append([]byte(nil), b...)
	}
	return c, early, nil
}

// readConnectAnswer reads an HTTP/1.x answer head and returns its status.
// The headers are skipped: a 2xx means the tunnel is up, nothing else matters.
func readConnectAnswer(br *bufio.Reader) (int, string, error) {
	total := 0
	first := true
	status := 0
	line := ""
	for {
		b, err := br.ReadSlice('\n')
		total += len(b)
		if total > maxConnectAnswer {
			return 0, "", errors.New("upstream answer head larger than " + strconv.Itoa(maxConnectAnswer) + " bytes")
		}
		if err == bufio.ErrBufferFull {
			if first {
				return 0, "", errors.New("upstream answer status line too long")
			}
			continue
		}
		if err != nil {
			if first {
				return 0, "", errors.New("no answer to CONNECT: " + err.Error())
			}
			return 0, "", errors.New("truncated answer to CONNECT: " + err.Error())
		}
		if first {
			first = false
			s := string(trimEOL(b))
			if len(s) < 12 || s[:7] != "HTTP/1." || s[8] != ' ' {
				return 0, "", errors.New("malformed answer to CONNECT: " + quote(s))
			}
			n, err := strconv.Atoi(s[9:12])
			if err != nil || n < 100 || n > 999 || (len(s) > 12 && s[12] != ' ') {
				return 0, "", errors.New("malformed answer to CONNECT: " + quote(s))
			}
			status, line = n, quote(s[9:])
			continue
		}
		if len(trimEOL(b)) == 0 {
			if status >= 100 && status < 200 {
				// An interim answer; the real one follows.
				first = true
				continue
			}
			return status, line, nil
		}
	}
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
