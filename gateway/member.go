package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/socks5"
	"github.com/proxyfleet/proxyfleet/internal/bufpool"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/internal/rawio"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

const (
	// maxIdlePerHost keeps enough idle keep-alive connections per upstream
	// (or per target for direct members) for a busy crawler.
	maxIdlePerHost  = 256
	idleConnTimeout = 90 * time.Second
)

// memberLinks is the stage that reaches members: the gateway's state per
// member (its keep-alive Transport, the lean path's pool, how to dial and
// authenticate to it), kept while the pool offers the member, and the
// connections through it: a direct dial from its source address, a SOCKS5
// or HTTP CONNECT chained through it. A direct member's dial asks the
// admission stage (targetChecker) for the target's checked addresses; it
// calls no later stage.
type memberLinks struct {
	dialTimeout time.Duration
	// answerTimeout is the Transports' ResponseHeaderTimeout: the default
	// answer timeout (Options.MemberAnswerTimeout).
	answerTimeout time.Duration
	siteRoots     *x509.CertPool
	targets       targetChecker
	readers       bufpool.Readers // for upstream CONNECT answers

	mu      sync.RWMutex
	members map[string]*memberConn
}

// targetChecker is what a direct member's dial asks of admission: the
// addresses of a target it may dial.
type targetChecker interface {
	dialAddrs(ctx context.Context, host string, port uint16) ([]netip.Addr, error)
}

func newMemberLinks(o Options, targets targetChecker) *memberLinks {
	return &memberLinks{dialTimeout: o.DialTimeout, answerTimeout: o.MemberAnswerTimeout, siteRoots: o.SiteRoots,
		targets: targets, members: make(map[string]*memberConn)}
}

// closeAll closes every member's idle connections (Shutdown).
func (ml *memberLinks) closeAll() {
	ml.mu.Lock()
	for _, mc := range ml.members {
		mc.close()
	}
	ml.mu.Unlock()
}

// memberConn is what the gateway keeps per member: how to reach it for
// CONNECT and a keep-alive transport for plain HTTP.
type memberConn struct {
	m         pool.Member
	nameHdr   []string // {m.Name}, shared by every response header
	transport *http.Transport
	// lean carries bodiless http:// requests through an http:// upstream
	// (see upstream.go); nil for other members.
	lean *upstreamPool
	// proxyAuth is the Proxy-Authorization value from the member URL's
	// userinfo ("" when none), sent with CONNECT.
	proxyAuth string
	// upstreamAddr is the upstream's host:port (port defaulted from the scheme).
	upstreamAddr string
	tlsConfig    *tls.Config  // https:// upstreams
	socks5       bool         // socks5:// upstreams
	local        *net.TCPAddr // direct members bound to SourceAddr
	// lastUsed (unix nanoseconds) is when a request last took this member,
	// for ForgetIdleMembers.
	lastUsed atomic.Int64
	// siteTr is transport without its ResponseHeaderTimeout, for sites
	// with an answer timeout of their own (siteTransport).
	siteOnce sync.Once
	siteTr   *http.Transport
}

// siteTransport is the member's Transport for sites with an answer timeout
// of their own: the shared one's ResponseHeaderTimeout (the default answer
// timeout) would cut a longer one short. Made on first use.
func (mc *memberConn) siteTransport() *http.Transport {
	mc.siteOnce.Do(func() {
		mc.siteTr = mc.transport.Clone()
		mc.siteTr.ResponseHeaderTimeout = 0
	})
	return mc.siteTr
}

// touch records a use of the member.
func (mc *memberConn) touch() *memberConn {
	mc.lastUsed.Store(time.Now().UnixNano())
	return mc
}

func (mc *memberConn) close() {
	mc.transport.CloseIdleConnections()
	if mc.siteTr != nil {
		mc.siteTr.CloseIdleConnections()
	}
	if mc.lean != nil {
		mc.lean.CloseIdle(true)
	}
}

// memberFor returns the state of m, creating it on first use and replacing
// it when the member's endpoint changed (a reload under the same name).
func (ml *memberLinks) memberFor(m pool.Member) (*memberConn, error) {
	ml.mu.RLock()
	mc := ml.members[m.Name]
	ml.mu.RUnlock()
	if mc != nil && mc.m.SameEndpoint(m) {
		return mc.touch(), nil
	}
	nmc, err := ml.newMemberConn(m)
	if err != nil {
		return nil, err
	}
	ml.mu.Lock()
	if cur := ml.members[m.Name]; cur != nil && cur.m.SameEndpoint(m) {
		ml.mu.Unlock()
		nmc.close()
		return cur.touch(), nil
	} else if cur != nil {
		cur.close()
	}
	ml.members[m.Name] = nmc.touch()
	ml.mu.Unlock()
	return nmc, nil
}

// memberByName returns the known state of a pinned member, nil when the
// gateway has none (never used, or forgotten).
func (ml *memberLinks) memberByName(name string) *memberConn {
	ml.mu.RLock()
	mc := ml.members[name]
	ml.mu.RUnlock()
	if mc != nil {
		mc.touch()
	}
	return mc
}

// forget drops the gateway's state for a member removed from the pool
// and closes its idle keep-alive connections. Pins to it are abandoned: the
// next request of those sessions leases afresh. Open tunnels are untouched.
func (ml *memberLinks) forget(name string) {
	ml.mu.Lock()
	mc := ml.members[name]
	delete(ml.members, name)
	ml.mu.Unlock()
	if mc != nil {
		mc.close()
	}
}

// forgetIdle forgets (as forget does) every member no request
// has taken for longer than idle, and returns their names. A gateway whose
// members come from a remote lease API never hears that one left the pool,
// so without this its per-member state would only grow; a member still in
// the pool is simply set up again on its next use.
func (ml *memberLinks) forgetIdle(idle time.Duration) []string {
	cutoff := time.Now().Add(-idle).UnixNano()
	var gone []*memberConn
	ml.mu.Lock()
	for name, mc := range ml.members {
		if mc.lastUsed.Load() < cutoff {
			delete(ml.members, name)
			gone = append(gone, mc)
		}
	}
	ml.mu.Unlock()
	names := make([]string, len(gone))
	for i, mc := range gone {
		mc.close()
		names[i] = mc.m.Name
	}
	return names
}

func (ml *memberLinks) newMemberConn(m pool.Member) (*memberConn, error) {
	mc := &memberConn{m: m, nameHdr: []string{m.Name}}
	tr := &http.Transport{
		// Never ProxyFromEnvironment: the gateway is the proxy.
		Proxy:                  nil,
		TLSHandshakeTimeout:    ml.dialTimeout,
		DisableCompression:     true, // pass encodings through untouched
		MaxIdleConnsPerHost:    maxIdlePerHost,
		IdleConnTimeout:        idleConnTimeout,
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
	mc.transport = tr
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
		mc.tlsConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	case "socks5", "socks5h":
		if port == "" {
			port = "1080"
		}
	default:
		return nil, errors.New("member " + strconv.Quote(m.Name) + ": unsupported upstream scheme " + strconv.Quote(u.Scheme))
	}
	mc.upstreamAddr = net.JoinHostPort(u.Hostname(), port)
	fwd := &net.Dialer{Timeout: ml.dialTimeout}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return wrapOrder(wrapRaw(fwd.DialContext(ctx, network, addr)))
	}
	proxyURL := *u
	tr.Proxy = http.ProxyURL(&proxyURL)
	mc.socks5 = u.Scheme == "socks5" || u.Scheme == "socks5h"
	if !mc.socks5 {
		// An https:// absolute URI goes through the member as a CONNECT the
		// transport makes; its refusal is classified like ours would be.
		tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode == http.StatusOK {
				return nil
			}
			ue := upstreamErrorOf(res.Header)
			return &fault.Attempt{F: rotation.UpstreamAnswer(res.StatusCode, ue),
				Err: &fault.Answer{Status: res.StatusCode, Line: echo.Quote(res.Status), UE: ue, Connect: true}}
		}
	}
	if u.User != nil {
		user := u.User.Username()
		pass, _ := u.User.Password()
		mc.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	if u.Scheme == "http" {
		mc.lean = newUpstreamPool(mc.upstreamAddr, ml.dialTimeout)
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
func (ml *memberLinks) dialDirectAddr(ctx context.Context, mc *memberConn, addr string) (net.Conn, error) {
	host, port, err := splitTarget(addr, "")
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if ca, ok := ctx.Value(checkedKey{}).(*checkedAddrs); ok && ca.host == host {
		addrs = ca.addrs
	}
	return ml.dialDirect(ctx, mc, host, port, addrs)
}

// dialDirect dials the target from the member's source address. addrs are
// the checked addresses; nil means resolve (and check) now.
func (ml *memberLinks) dialDirect(ctx context.Context, mc *memberConn, host string, port uint16, addrs []netip.Addr) (net.Conn, error) {
	if addrs == nil {
		var err error
		if addrs, err = ml.targets.dialAddrs(ctx, host, port); err != nil {
			return nil, err
		}
	}
	src := mc.m.SourceAddr
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

// dialConnect opens a connection that carries bytes to hostport through mc:
// a direct dial from the member's source address to a checked address, a
// SOCKS5 CONNECT, or an HTTP CONNECT to an http(s) upstream whose answer
// must be 2xx. early holds bytes the upstream sent behind its answer.
//
// Every failure leaves here classified (an *fault.Attempt): reaching the
// member, its handshakes and a garbled answer are the member's fault; what
// the member answered about the site, and a member that took our CONNECT
// but did not answer within answerTimeout (it is waiting on the site, or
// it is dead: checkAlive tells), are the site's.
func (ml *memberLinks) dialConnect(ctx context.Context, mc *memberConn, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (c net.Conn, early []byte, err error) {
	dctx, cancel := context.WithTimeout(ctx, ml.dialTimeout)
	defer cancel()
	if mc.m.URL == nil {
		c, err = ml.dialDirect(dctx, mc, host, port, addrs)
		return c, nil, classifyDirect(err)
	}
	if c, err = ml.dialMember(dctx, mc); err != nil {
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
	if mc.socks5 {
		err = socks5.Connect(c, mc.m.URL.User, host, port)
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

// dialMember connects to the proxy member mc itself, TLS included for an
// https:// member, within ctx; its failures are the member's.
func (ml *memberLinks) dialMember(ctx context.Context, mc *memberConn) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", mc.upstreamAddr)
	if err != nil {
		return nil, fault.Member("dial", err)
	}
	if mc.tlsConfig == nil {
		return c, nil
	}
	tc := tls.Client(c, mc.tlsConfig)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, fault.Member("tls", errors.New("TLS to upstream: "+err.Error()))
	}
	return tc, nil
}

// connectExchange sends our CONNECT for hostport on c, a connection to the
// http(s) member mc, and reads its answer, which must be 2xx; early holds
// bytes the member sent behind it. c's deadline bounds the answer.
func (ml *memberLinks) connectExchange(ctx context.Context, c net.Conn, mc *memberConn, hostport string, answerTimeout time.Duration) (early []byte, err error) {
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
		return nil, fault.Member("write", err)
	}
	br := ml.readers.Get(c)
	defer ml.readers.Put(br)
	status, line, ue, err := readConnectAnswer(br)
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
