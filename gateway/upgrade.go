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

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/internal/httphead"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// isWebSocket reports a WebSocket opening handshake (RFC 6455 4.1):
// Upgrade names websocket and Connection names upgrade. Other upgrades
// (h2c, ...) are not carried: their Upgrade is dropped as hop-by-hop.
func isWebSocket(r *http.Request) bool {
	return r.Method == http.MethodGet && front.HasToken(r.Header["Upgrade"], "websocket") &&
		front.HasToken(r.Header["Connection"], "upgrade")
}

// socket is a WebSocket handshake's connection to the site and the answer
// read from it.
type socket struct {
	c    net.Conn
	br   *bufio.Reader
	resp *http.Response
}

// serveUpgrade carries a WebSocket handshake to the site through a member
// on the one retry loop: an answer other than 101 is an answer like any
// other (a ban rests the member for the site and the handshake goes on to
// another, since nothing was upgraded yet), and after 101 the client's
// connection and the socket are relayed byte for byte as a tunnel (frames
// are not read), the lease held until it ends. out is the request to send,
// its Upgrade and Connection put back.
func (rp *requestPath) serveUpgrade(ctx context.Context, rq *request, r, out *http.Request, host string, port uint16) {
	_, addrs, _ := link.CheckedAny(ctx)
	out.Header["Connection"] = []string{"Upgrade"}
	out.Header["Upgrade"] = []string{"websocket"}
	answerTimeout := rp.ex.answerTimeoutFor(rq.lr.target)
	rule := retryRule{retryable: true, maxRetries: rp.retries}
	at := attempts{hostport: out.URL.Host}
	var (
		s    socket
		used held
		res  rotation.Result
	)
	err := rp.tryMembers(ctx, r.Context(), rq, &at, rule, func(h held, attempt int) (served, error) {
		var err error
		if s, err = rp.ex.handshake(ctx, rq.mirror, h.mc, out, host, port, addrs, answerTimeout); err != nil {
			return tryAnother, err
		}
		used, res = h, rp.classifier.ClassifyAnswer(rotation.Answer{Status: s.resp.StatusCode, Header: s.resp.Header})
		// As forwardWithRetry: a ban cuts the site's pace before anything
		// else is sent, honours the site's Retry-After, and ends a strict
		// session rather than moving it to another member.
		rp.pacer.Answered(&rq.pace, rq.lr.target, rq.member, res)
		rp.tierAnswered(ctx, rq, h, res)
		if s.resp.StatusCode == http.StatusSwitchingProtocols || !res.IsBan() {
			return servedHere, nil
		}
		rp.leases.drop(ctx, rq.lr, h, res, siteRetryAfter(res, s.resp.Header))
		rq.h = held{}
		if rq.lr.p.Strict {
			_ = s.c.Close()
			return tryAnother, rp.leases.lostSession(rq, h, "was banned by the site ("+strconv.Itoa(s.resp.StatusCode)+", "+string(res)+")")
		}
		if attempt < rp.retries {
			if n, err := rp.acquireNext(ctx, rq); err == nil {
				_ = s.c.Close()
				rq.next = n
				return tryAnother, nil
			}
		}
		return servedHere, nil
	})
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	if s.resp.StatusCode != http.StatusSwitchingProtocols {
		// Refused: its answer goes to the client as any answer does.
		defer s.c.Close()
		if !res.IsBan() {
			rp.leases.succeeded(ctx, &rq.lr, used)
		}
		ok := rp.deliver(rq.w, r, s.resp, used, res, rq.attempts, rq.start, rq.lr.p.Client)
		if !res.IsBan() {
			rp.leases.done(ctx, used)
		}
		rp.exit.trace(ctx, rq, outcomeOf(res), "")
		if !ok {
			panic(http.ErrAbortHandler)
		}
		return
	}
	var early []byte
	if n := s.br.Buffered(); n > 0 {
		b, _ := s.br.Peek(n)
		early = append([]byte(nil), b...)
	}
	header := make(http.Header, len(s.resp.Header))
	for k, vv := range s.resp.Header {
		if !strings.HasPrefix(k, headerPrefix) {
			header[k] = vv
		}
	}
	rp.runTunnel(ctx, rq.w, rq, s.c, early, "101 Switching Protocols", header)
}

// handshake opens a connection for out to the site through mc and reads
// the site's answer head. A ws:// handshake goes to an http(s) member in
// absolute form, as any plain request (Squid carries it with
// http_upgrade_request_protocols); a wss:// one (inside a MITM tunnel)
// goes through a tunnel the member opens to the site, with the gateway's
// own TLS to the site, verified as a MITM'd request's is. Errors are
// classified as an attempt's.
func (x *exchange) handshake(ctx context.Context, mirror *innerTunnel, mc *link.Link, out *http.Request, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (socket, error) {
	for {
		s, err := x.handshakeOnce(ctx, mirror, mc, out, host, port, addrs, answerTimeout)
		if !errors.Is(err, errFellBack) {
			return s, err
		}
		// The gateway's own TLS failed with the client's hello: a new
		// connection through the same member, with a preset.
	}
}

// handshakeOnce is one connection of handshake.
func (x *exchange) handshakeOnce(ctx context.Context, mirror *innerTunnel, mc *link.Link, out *http.Request, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (socket, error) {
	proxyForm := out.URL.Scheme == "http" && mc.Member.URL != nil && !mc.SOCKS5
	var (
		c   net.Conn
		err error
	)
	if proxyForm {
		dctx, cancel := context.WithTimeout(ctx, x.dialTimeout)
		c, err = x.links.dialMember(dctx, mc)
		cancel()
	} else {
		var early []byte
		c, early, err = x.links.dialConnect(ctx, mc, out.URL.Host, host, port, addrs, answerTimeout)
		if err == nil && len(early) > 0 {
			c = &prefixConn{Conn: c, prefix: early}
		}
	}
	if err != nil {
		return socket{}, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(keepalive.ALongTimeAgo) })
	s, err := x.handshakeOn(ctx, mirror, c, mc, out, host, proxyForm, answerTimeout)
	if !stop() && err == nil {
		err = fault.ErrClientGone
	}
	if err != nil {
		_ = c.Close()
		return socket{}, err
	}
	_ = c.SetDeadline(time.Time{})
	return s, nil
}

// handshakeOn writes out on c (TLS to the site first for wss://, with the
// client's ClientHello when mirror, the request's tunnel, mirrors it) and
// reads the answer head within answerTimeout.
func (x *exchange) handshakeOn(ctx context.Context, mirror *innerTunnel, c net.Conn, mc *link.Link, out *http.Request, host string, proxyForm bool, answerTimeout time.Duration) (socket, error) {
	if mirror != nil && out.URL.Scheme == "https" {
		// The client's ClientHello, offering HTTP/1.1 only: after 101 the
		// bytes are relayed, which HTTP/2 has no place for.
		tc, _, err := x.siteTLS(ctx, c, mirror, mc.Member.Name, speaksUpgrade)
		if err != nil {
			return socket{}, err
		}
		c = tc
	} else if out.URL.Scheme == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: x.siteRoots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
		_ = tc.SetDeadline(time.Now().Add(x.dialTimeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			if fault.IsCertError(err) {
				return socket{}, fault.SiteCertificate(host, err)
			}
			return socket{}, fault.Site(rotation.Site("tls"), errors.New("TLS to the site: "+err.Error()))
		}
		c = tc
	}
	_ = c.SetDeadline(time.Now().Add(answerTimeout))
	if proxyForm && mc.ProxyAuth != "" {
		out.Header["Proxy-Authorization"] = []string{mc.ProxyAuth}
		defer delete(out.Header, "Proxy-Authorization")
	}
	if err := x.WriteRequest(c, out, proxyForm); err != nil {
		return socket{}, fault.Member("write", err)
	}
	hr := sitelink.NewHeadReader(c)
	br := bufio.NewReader(&hr)
	// Interim answers (103 Early Hints) come before the 101 or the refusal.
	resp, err := sitelink.ReadFinalHead(br, &hr, out)
	var mh *sitelink.MalformedHead
	switch {
	case err != nil && fault.IsTimeout(err) && ctx.Err() == nil:
		return socket{}, fault.AnswerTimedOut(answerTimeout, "the WebSocket handshake")
	case errors.Is(err, link.ErrHeadTooLarge), errors.As(err, &mh) && !proxyForm:
		// The site's, as on a MITM'd request; certain when the gateway
		// read it over its own TLS to the site or from a direct member's
		// address. An oversized head a proxy member relayed is the site's
		// too (MemberEvidence tells a member that does so for every site);
		// a garbled one may be the member's own answer, as on the plain
		// path.
		return socket{}, sitelink.HeadFault(err, out.URL.Scheme == "https" || mc.Member.Direct())
	case err != nil:
		return socket{}, fault.Member("protocol", err)
	}
	if proxyForm {
		if err := upstreamAnswer(resp); err != nil {
			return socket{}, err
		}
	}
	return socket{c: c, br: br, resp: resp}, nil
}

// WriteRequest writes out on c, a connection of the gateway's own to a
// member or a site (in absolute form when proxy), through a pooled buffer:
// net/http's Write on a bare connection would make a 4 KiB one for every
// request.
func (x *exchange) WriteRequest(c net.Conn, out *http.Request, proxy bool) error {
	bw := x.writers.Get(c)
	defer x.writers.Put(bw)
	err := httphead.WriteRequest(bw, out, proxy)
	if err == nil {
		err = bw.Flush()
	}
	return err
}
