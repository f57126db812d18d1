// Package link is the gateway's member links: its state per member (Link:
// the keep-alive Transport, the lean path's pool of connections to an
// http:// upstream, the address and credentials), made by a Dialer, and
// the connections through a member: a direct dial from its source address,
// a SOCKS5 or HTTP CONNECT chained through it (its answer read and
// classified), the member itself. Every failure leaves here classified
// (gateway/fault). A direct member's dial asks the admission stage for the
// target's checked addresses through the TargetChecker it was given; it
// calls nothing else of the gateway. The registry of links by member name
// is the gateway's.
package link

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/gateway/socks5"
	"github.com/proxyfleet/proxyfleet/internal/bufpool"
	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
	"github.com/proxyfleet/proxyfleet/internal/httphead"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/internal/rawio"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Dialer makes members' links and the connections through them.
type Dialer struct {
	dialTimeout time.Duration
	// answerTimeout is the Transports' ResponseHeaderTimeout: the default
	// answer timeout (the gateway's MemberAnswerTimeout).
	answerTimeout time.Duration
	siteRoots     *x509.CertPool
	targets       TargetChecker
	readers       bufpool.Readers // for upstream CONNECT answers
}

// TargetChecker is what a direct member's dial asks of admission: the
// addresses of a target it may dial.
type TargetChecker interface {
	DialAddrs(ctx context.Context, host string, port uint16) ([]netip.Addr, error)
}

// NewDialer returns a Dialer whose dials take at most dialTimeout, whose
// Transports wait answerTimeout for an answer's head by default and verify
// sites against siteRoots (nil: the system's).
func NewDialer(dialTimeout, answerTimeout time.Duration, siteRoots *x509.CertPool, targets TargetChecker) *Dialer {
	return &Dialer{dialTimeout: dialTimeout, answerTimeout: answerTimeout, siteRoots: siteRoots, targets: targets}
}

// WithChecked carries a target's checked addresses from the handler to a
// direct member's dial in ctx (see checkedKey).
func WithChecked(ctx context.Context, host string, addrs []netip.Addr) context.Context {
	return context.WithValue(ctx, checkedKey{}, &checkedAddrs{host: host, addrs: addrs})
}

// Checked returns the checked addresses ctx carries for host, nil when
// none.
func Checked(ctx context.Context, host string) []netip.Addr {
	if ca, ok := ctx.Value(checkedKey{}).(*checkedAddrs); ok && ca.host == host {
		return ca.addrs
	}
	return nil
}

// CheckedAny returns the checked addresses ctx carries and their host.
func CheckedAny(ctx context.Context) (string, []netip.Addr, bool) {
	if ca, ok := ctx.Value(checkedKey{}).(*checkedAddrs); ok {
		return ca.host, ca.addrs, true
	}
	return "", nil, false
}

// aliveTimeout bounds Aliveness's question (capped by the dial timeout): a
// proxy answers a request it needs no site for in milliseconds.
const aliveTimeout = 5 * time.Second

// maxConnectAnswer bounds an upstream's answer head to our CONNECT.
const maxConnectAnswer = 64 << 10

const (
	// MaxIdlePerHost keeps enough idle keep-alive connections per upstream
	// (or per target for direct members) for a busy crawler.
	MaxIdlePerHost  = 256
	IdleConnTimeout = 90 * time.Second
)

// Link is what the gateway keeps per member: how to reach it for
// CONNECT and a keep-alive transport for plain HTTP.
type Link struct {
	Member    pool.Member
	NameHdr   []string // {Member.Name}, shared by every response header
	Transport *http.Transport
	// Lean carries bodiless http:// requests through an http:// upstream
	// (UpstreamPool); nil for other members.
	Lean *UpstreamPool
	// ProxyAuth is the Proxy-Authorization value from the member URL's
	// userinfo ("" when none), sent with CONNECT.
	ProxyAuth string
	// UpstreamAddr is the upstream's host:port (port defaulted from the scheme).
	UpstreamAddr string
	TLSConfig    *tls.Config  // https:// upstreams
	SOCKS5       bool         // socks5:// upstreams
	local        *net.TCPAddr // direct members bound to SourceAddr
	// LastUsed (unix nanoseconds) is when a request last took this member,
	// for ForgetIdleMembers.
	LastUsed atomic.Int64
	// siteTr is Transport without its ResponseHeaderTimeout, for sites
	// with an answer timeout of their own (SiteTransport).
	siteOnce sync.Once
	siteTr   *http.Transport
}

// SiteTransport is the member's Transport for sites with an answer timeout
// of their own: the shared one's ResponseHeaderTimeout (the default answer
// timeout) would cut a longer one short. Made on first use.
func (mc *Link) SiteTransport() *http.Transport {
	mc.siteOnce.Do(func() {
		mc.siteTr = mc.Transport.Clone()
		mc.siteTr.ResponseHeaderTimeout = 0
	})
	return mc.siteTr
}

// Touch records a use of the member.
func (mc *Link) Touch() {
	mc.LastUsed.Store(time.Now().UnixNano())
}

// Close closes the member's idle connections.
func (mc *Link) Close() {
	mc.Transport.CloseIdleConnections()
	if mc.siteTr != nil {
		mc.siteTr.CloseIdleConnections()
	}
	if mc.Lean != nil {
		mc.Lean.CloseIdle(true)
	}
}

// Open makes m's link: its Transport (dialing through the member, or
// directly from its source address), the lean path's pool for an http://
// member, its credentials. It opens no connection.
func (ml *Dialer) Open(m pool.Member) (*Link, error) {
	mc := &Link{Member: m, NameHdr: []string{m.Name}}
	tr := &http.Transport{
		// Never ProxyFromEnvironment: the gateway is the proxy.
		Proxy:                  nil,
		TLSHandshakeTimeout:    ml.dialTimeout,
		DisableCompression:     true, // pass encodings through untouched
		MaxIdleConnsPerHost:    MaxIdlePerHost,
		IdleConnTimeout:        IdleConnTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		// The default answer timeout, from the request's write (send).
		ResponseHeaderTimeout: ml.answerTimeout,
	}
	if ml.siteRoots != nil {
		// The gateway's own TLS to sites (MITM'd tunnels, https:// URIs)
		// verifies against these; an https:// member's certificate too
		// when the transport reaches it, which classifySiteTLS tells apart.
		tr.TLSClientConfig = &tls.Config{RootCAs: ml.siteRoots, MinVersion: tls.VersionTLS12}
	}
	mc.Transport = tr
	if m.URL == nil {
		if m.SourceAddr.IsValid() {
			mc.local = &net.TCPAddr{IP: m.SourceAddr.AsSlice(), Zone: m.SourceAddr.Zone()}
		}
		tr.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) {
			return wrapOrder(wrapRaw(ml.dialDirectAddr(ctx, mc, addr)))
		}
		return mc, nil
	}
	u := m.URL
	port := u.Port()
	switch u.Scheme {
	case "http":
		if port == "" {
			port = "80"
		}
	case "https":
		if port == "" {
			port = "443"
		}
		mc.TLSConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	case "socks5", "socks5h":
		if port == "" {
			port = "1080"
		}
	default:
		return nil, errors.New("member " + strconv.Quote(m.Name) + ": unsupported upstream scheme " + strconv.Quote(u.Scheme))
	}
	mc.UpstreamAddr = net.JoinHostPort(u.Hostname(), port)
	fwd := &net.Dialer{Timeout: ml.dialTimeout}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return wrapOrder(wrapRaw(fwd.DialContext(ctx, network, addr)))
	}
	proxyURL := *u
	tr.Proxy = http.ProxyURL(&proxyURL)
	mc.SOCKS5 = u.Scheme == "socks5" || u.Scheme == "socks5h"
	if !mc.SOCKS5 {
		// An https:// absolute URI goes through the member as a CONNECT the
		// transport makes; its refusal is classified like ours would be.
		tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode == http.StatusOK {
				return nil
			}
			ue := UpstreamErrorOf(res.Header)
			return &fault.Attempt{F: rotation.UpstreamAnswer(res.StatusCode, ue),
				Err: &fault.Answer{Status: res.StatusCode, Line: echo.Quote(res.Status), UE: ue, Connect: true}}
		}
	}
	if u.User != nil {
		user := u.User.Username()
		pass, _ := u.User.Password()
		mc.ProxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	if u.Scheme == "http" {
		mc.Lean = newUpstreamPool(mc.UpstreamAddr, ml.dialTimeout)
	}
	return mc, nil
}

// wrapRaw hands the member's Transport the connection it dialed wrapped by
// internal/rawio (no runtime system call per read or write), as the lean
// path's and the client's are: the Transport only reads and writes it
// (through its TLS, for an https:// URL or a MITM'd tunnel under the go
// fingerprint), and no tunnel splices it.
func wrapRaw(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return rawio.Wrap(c), nil
}

// checkedKey carries a target's checked addresses from the handler to a
// direct member's dial, so the transport dials what was checked instead of
// resolving the name again (no DNS rebinding between check and dial).
type checkedKey struct{}

type checkedAddrs struct {
	host  string
	addrs []netip.Addr
}

// directMemberFault reports whether a direct member's dial failed because of
// the member itself (its source address is gone from the host, or it ran
// out of ports), not because of the target. Only such failures count
// against a direct member: a dead site must not take the egress address
// out for every other site.
func directMemberFault(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EADDRINUSE)
}

// dialDirectAddr is a direct member's transport dial: addr is host:port.
func (ml *Dialer) dialDirectAddr(ctx context.Context, mc *Link, addr string) (net.Conn, error) {
	host, port, err := sites.SplitTarget(addr, "")
	if err != nil {
		return nil, err
	}
	return ml.dialDirect(ctx, mc, host, port, Checked(ctx, host))
}

// dialDirect dials the target from the member's source address. addrs are
// the checked addresses; nil means resolve (and check) now.
func (ml *Dialer) dialDirect(ctx context.Context, mc *Link, host string, port uint16, addrs []netip.Addr) (net.Conn, error) {
	if addrs == nil {
		var err error
		if addrs, err = ml.targets.DialAddrs(ctx, host, port); err != nil {
			return nil, err
		}
	}
	src := mc.Member.SourceAddr
	d := net.Dialer{Timeout: ml.dialTimeout}
	if mc.local != nil {
		d.LocalAddr = mc.local
		d.Control = bindNoPort
	}
	var firstErr error
	tried := 0
	for _, a := range addrs {
		if src.IsValid() && src.Unmap().Is4() != a.Is4() {
			continue // a source address of the other family cannot reach it
		}
		tried++
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if tried == 0 {
		return nil, errors.New("target " + echo.Quote(host) + " has no address of the family of source address " + src.String())
	}
	return nil, firstErr
}

// DialConnect opens a connection that carries bytes to hostport through mc:
// a direct dial from the member's source address to a checked address, a
// SOCKS5 CONNECT, or an HTTP CONNECT to an http(s) upstream whose answer
// must be 2xx. early holds bytes the upstream sent behind its answer.
//
// Every failure leaves here classified (an *fault.Attempt): reaching the
// member, its handshakes and a garbled answer are the member's fault; what
// the member answered about the site, and a member that took our CONNECT
// but did not answer within answerTimeout (it is waiting on the site, or
// it is dead: checkAlive tells), are the site's.
func (ml *Dialer) DialConnect(ctx context.Context, mc *Link, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (c net.Conn, early []byte, err error) {
	dctx, cancel := context.WithTimeout(ctx, ml.dialTimeout)
	defer cancel()
	if mc.Member.URL == nil {
		c, err = ml.dialDirect(dctx, mc, host, port, addrs)
		return c, nil, ClassifyDirect(err)
	}
	if c, err = ml.DialMember(dctx, mc); err != nil {
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
				err = fault.Member("timeout", ctx.Err())
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
	if mc.SOCKS5 {
		err = socks5.Connect(c, mc.Member.URL.User, host, port)
		var re *socks5.ReplyError
		switch {
		case err == nil:
		case errors.As(err, &re):
			err = &fault.Attempt{F: rotation.SOCKSReply(re.Code), Err: err}
		case fault.IsTimeout(err) && ctx.Err() == nil:
			err = fault.AnswerTimedOut(answerTimeout, "SOCKS5 CONNECT")
		}
		return c, nil, err
	}
	early, err = ml.connectExchange(ctx, c, mc, hostport, answerTimeout)
	return c, early, err
}

// DialMember connects to the proxy member mc itself, TLS included for an
// https:// member, within ctx; its failures are the member's.
func (ml *Dialer) DialMember(ctx context.Context, mc *Link) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", mc.UpstreamAddr)
	if err != nil {
		return nil, fault.Member("dial", err)
	}
	if mc.TLSConfig == nil {
		return c, nil
	}
	tc := tls.Client(c, mc.TLSConfig)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, fault.Member("tls", errors.New("TLS to upstream: "+err.Error()))
	}
	return tc, nil
}

// connectExchange sends our CONNECT for hostport on c, a connection to the
// http(s) member mc, and reads its answer, which must be 2xx; early holds
// bytes the member sent behind it. c's deadline bounds the answer.
func (ml *Dialer) connectExchange(ctx context.Context, c net.Conn, mc *Link, hostport string, answerTimeout time.Duration) (early []byte, err error) {
	req := make([]byte, 0, 64+2*len(hostport)+len(mc.ProxyAuth))
	req = append(req, "CONNECT "...)
	req = append(req, hostport...)
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, hostport...)
	req = append(req, "\r\n"...)
	if mc.ProxyAuth != "" {
		req = append(req, "Proxy-Authorization: "...)
		req = append(req, mc.ProxyAuth...)
		req = append(req, "\r\n"...)
	}
	req = append(req, "\r\n"...)
	if _, err = c.Write(req); err != nil {
		return nil, fault.Member("write", err)
	}
	br := ml.readers.Get(c)
	defer ml.readers.Put(br)
	status, line, ue, err := ReadConnectAnswer(br)
	if err != nil {
		if errors.Is(err, errNoAnswerYet) && ctx.Err() == nil {
			// The member took the CONNECT and is still working on it:
			// Squid answers only once it reached the site (or gave up).
			return nil, fault.AnswerTimedOut(answerTimeout, "CONNECT")
		}
		return nil, fault.Member("protocol", err)
	}
	if status < 200 || status > 299 {
		ae := &fault.Answer{Status: status, Line: line, UE: ue, Connect: true}
		return nil, &fault.Attempt{F: rotation.UpstreamAnswer(status, ue), Err: ae}
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		early = append([]byte(nil), b...)
	}
	return early, nil
}

// The lean forwarding path: a plain-HTTP request without a body, for an
// http:// URL, through an http:// upstream proxy (the common case of a
// crawler behind Squid) is written and answered on the handler's own
// goroutine over a pooled keep-alive connection. net/http's Transport runs
// two goroutines per connection and hands every request and answer between
// them and the caller; on a busy two-core box those hand-offs cost more
// CPU than the proxying itself. Everything else (request bodies, https://
// URLs, TLS or SOCKS upstreams, direct members) keeps using the Transport.

const (
	// MaxResponseHead bounds an upstream's answer head (1xx heads
	// included), as Transport.MaxResponseHeaderBytes did.
	MaxResponseHead = 1 << 20
)

var (
	ErrHeadTooLarge   = errors.New("upstream answer head larger than 1 MiB")
	errUpstreamClosed = errors.New("upstream closed the keep-alive connection before answering")
)

// UpstreamPool keeps idle keep-alive connections to one http:// upstream
// (internal/keepalive) and runs the lean exchange over them.
type UpstreamPool struct {
	*keepalive.Pool
}

// upConn is one connection to the upstream with its buffers.
type upConn = keepalive.Conn

func newUpstreamPool(addr string, dialTimeout time.Duration) *UpstreamPool {
	return &UpstreamPool{keepalive.NewPool(addr, keepalive.Options{DialTimeout: dialTimeout, MaxIdle: MaxIdlePerHost, IdleTimeout: IdleConnTimeout})}
}

// LeanEligible reports whether req can take the lean path through mc.
func LeanEligible(mc *Link, req *http.Request) bool {
	return mc.Lean != nil && req.Body == nil && req.URL.Scheme == "http"
}

// Replayable mirrors net/http's rule for resending a request on a fresh
// connection after a kept-alive one turned out to be closed: the methods
// rotation.Retryable allows (the lean path carries no body), or any request
// with an idempotency key, since the upstream never saw it.
func Replayable(req *http.Request) bool {
	if req.Method == "" || rotation.Retryable(req.Method, false) {
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// RoundTripLean sends req (absolute URI, no body) to the upstream and returns
// its final answer; the answer's body hands the connection back to the
// pool once read to the end. ctx aborts the exchange, body included; the
// answer's first byte must arrive within answerTimeout of the request's
// write (else fault.ErrAnswerTimeout). A kept-alive connection that turns out
// closed is replaced by a fresh one when the request may be resent.
func (p *UpstreamPool) RoundTripLean(ctx context.Context, req *http.Request, ProxyAuth string, answerTimeout time.Duration) (*http.Response, error) {
	if ProxyAuth != "" {
		// Only for this member: a retry may go through another one.
		req.Header["Proxy-Authorization"] = []string{ProxyAuth}
		defer delete(req.Header, "Proxy-Authorization")
	}
	var replay func() error
	if Replayable(req) {
		replay = func() error { return nil } // the lean path carries no body
	}
	o := keepalive.ExchangeOptions{Proxy: true, MaxHead: MaxResponseHead, HeadTooLarge: ErrHeadTooLarge,
		Closed: errUpstreamClosed, AnswerTimeout: answerTimeout}
	var resp *http.Response
	err := p.Do(ctx, replay, func(pc *upConn) (stale bool, err error) {
		a, stale, err := p.RoundTrip(ctx, pc, req, o)
		if err != nil {
			return stale, err
		}
		resp = a.Response
		resp.Body = &upBody{rc: resp.Body, a: a}
		return false, nil
	})
	if errors.Is(err, keepalive.ErrAnswerTimeout) {
		err = fault.ErrAnswerTimeout
	}
	return resp, err
}

// upBody is an answer body on the lean path: read to its end, it hands the
// connection back; closed early or broken, it closes the connection.
type upBody struct {
	rc   io.ReadCloser
	a    keepalive.Answer
	done bool
	err  error
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		if b.err != nil {
			return 0, b.err
		}
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err != nil {
		if err == io.EOF {
			b.finish(true)
		} else {
			b.err = err
			b.finish(false)
		}
	}
	return n, err
}

// Close ends the body. The inner body's Close is not called: it would
// read the rest of a long body; closing the connection is cheaper.
func (b *upBody) Close() error {
	if !b.done {
		b.finish(b.rc == http.NoBody)
		if b.err == nil {
			b.err = errors.New("read on closed body")
		}
	}
	return nil
}

func (b *upBody) finish(complete bool) {
	b.done = true
	b.a.Release(complete)
}

// A request the gateway writes itself (the lean path, a MITM'd request on
// a tunnel's site link, a WebSocket handshake) goes out with its client's
// field order and names (internal/httphead, from the order the front end
// kept: internal/fieldorder). A plain-HTTP request left to a member's
// Transport (one with a body, or through a direct or SOCKS member) is
// written by net/http, in Go's order: the connection under the Transport,
// an orderConn, puts that head back in the client's order as it is
// written. The Transport says which connection a request got
// (httptrace's GotConn) before it writes the request on it, and a
// connection carries one request at a time, so the head that follows is
// that request's.

// orderConn is a connection of a member's Transport that, armed for a
// request, rewrites the next request head written on it into the
// client's order (httphead.Reorder), and passes everything else through.
type orderConn struct {
	net.Conn
	mu    sync.Mutex
	armed bool
	o     fieldorder.Order
	proxy bool
	head  *[]byte // the armed head so far (from headBufs)
}

// headBufs hold heads being rewritten, and the rewritten ones, between
// arm and the head's last Write: a pooled connection holds none.
var headBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// putHeadBuf hands b back, unless a rare large head grew it.
func putHeadBuf(b *[]byte) {
	if cap(*b) <= 64<<10 {
		*b = (*b)[:0]
		headBufs.Put(b)
	}
}

// errOrderedHeadTooLarge is a head net/http wrote that grew past any the
// front end lets in: it is not sent (half a head would be).
var errOrderedHeadTooLarge = errors.New("request head larger than the gateway sends")

// maxOrderedHead bounds the head an orderConn holds: the front end's head
// limit plus what the Transport adds.
const maxOrderedHead = 1<<20 + 64<<10

// wrapOrder puts an orderConn over a Transport's dialed connection.
func wrapOrder(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return &orderConn{Conn: c}, nil
}

// arm makes the next head written the client's of o (in absolute form
// when proxy).
func (c *orderConn) arm(o fieldorder.Order, proxy bool) {
	c.mu.Lock()
	c.armed, c.o, c.proxy = true, o, proxy
	if c.head == nil {
		c.head = headBufs.Get().(*[]byte)
	}
	*c.head = (*c.head)[:0]
	c.mu.Unlock()
}

func (c *orderConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.armed {
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	head := append(*c.head, p...)
	*c.head = head
	end := bytes.Index(head, []byte("\r\n\r\n"))
	if end < 0 {
		tooLarge := len(head) > maxOrderedHead
		c.mu.Unlock()
		if tooLarge {
			return 0, errOrderedHeadTooLarge
		}
		return len(p), nil
	}
	ob := headBufs.Get().(*[]byte)
	out := httphead.Reorder((*ob)[:0], head[:end+4], c.o, c.proxy)
	out = append(out, head[end+4:]...)
	*ob = out
	putHeadBuf(c.head)
	c.armed, c.head = false, nil
	c.mu.Unlock()
	_, err := c.Conn.Write(out)
	putHeadBuf(ob)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// orderArmer arms the connection a request gets: its trace's GotConn.
type orderArmer struct {
	trace httptrace.ClientTrace
	o     fieldorder.Order
	proxy bool
}

func (a *orderArmer) gotConn(info httptrace.GotConnInfo) {
	if oc, ok := info.Conn.(*orderConn); ok {
		oc.arm(a.o, a.proxy)
	}
}

// WithOrder returns out with a trace that arms its connection when out
// carries its client's field order and goes to the Transport as plain
// HTTP through mc (over TLS the head is above the connection: it keeps
// Go's order). proxy is whether mc is an HTTP proxy, which gets the
// request in absolute form. Four allocations a request, on the
// Transport's path only.
func WithOrder(out *http.Request, mc *Link) *http.Request {
	if out.URL.Scheme != "http" {
		return out
	}
	o, ok := fieldorder.FromContext(out.Context())
	if !ok {
		return out
	}
	a := &orderArmer{o: o, proxy: !mc.Member.Direct() && !mc.SOCKS5}
	a.trace.GotConn = a.gotConn
	return out.WithContext(httptrace.WithClientTrace(out.Context(), &a.trace))
}

// errNoAnswerYet: the read deadline passed before the first byte of an
// answer to CONNECT.
var errNoAnswerYet = errors.New("no answer to CONNECT yet")

// ReadConnectAnswer reads an HTTP/1.x answer head and returns its status.
// A 2xx means the tunnel is up and its headers are skipped; a failure's
// error headers are kept, since they say whose failure it was.
func ReadConnectAnswer(br *bufio.Reader) (int, string, rotation.UpstreamError, error) {
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
			if first && total == 0 && fault.IsTimeout(err) {
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

// UpstreamErrorOf reads the same headers from a plain-HTTP answer.
func UpstreamErrorOf(h http.Header) rotation.UpstreamError {
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

// ClassifyDirect gives a direct member's dial failure its verdict: the
// member's own when its source address is gone or out of ports, else the
// site's, firsthand.
func ClassifyDirect(err error) error {
	if err == nil {
		return nil
	}
	var te *fault.Target
	if errors.As(err, &te) {
		return err
	}
	if directMemberFault(err) {
		return fault.Member("source address", err)
	}
	return &fault.Attempt{F: rotation.Site("connect"), Err: err, Firsthand: true}
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

// Aliveness asks mc for an answer that needs no site: an https:// member's
// TLS handshake, a SOCKS5 member's method choice, an http:// member's
// answer to an origin-form request (a forward proxy refuses it at once,
// 400 from Squid). Any byte back within aliveTimeout is alive. It is not a
// health probe (that fetches a URL through the member): it tells a member
// that is up and waiting on a site from one that is not there at all.
func Aliveness(mc *Link, dialTimeout time.Duration) error {
	wait := min(aliveTimeout, dialTimeout)
	c, err := net.DialTimeout("tcp", mc.UpstreamAddr, dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	switch {
	case mc.TLSConfig != nil:
		return tls.Client(c, mc.TLSConfig).Handshake()
	case mc.SOCKS5:
		_, err = c.Write([]byte{5, 1, 0})
	default:
		_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: " + mc.UpstreamAddr + "\r\nConnection: close\r\n\r\n"))
	}
	if err != nil {
		return err
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return errors.New("no answer within " + wait.String() + ": " + err.Error())
	}
	return nil
}
