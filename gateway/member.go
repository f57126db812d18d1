package gateway

import (
	"context"
	"crypto/tls"
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

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
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
func (g *Gateway) memberFor(m pool.Member) (*memberConn, error) {
	g.membersMu.RLock()
	mc := g.members[m.Name]
	g.membersMu.RUnlock()
	if mc != nil && mc.m.SameEndpoint(m) {
		return mc.touch(), nil
	}
	nmc, err := g.newMemberConn(m)
	if err != nil {
		return nil, err
	}
	g.membersMu.Lock()
	if cur := g.members[m.Name]; cur != nil && cur.m.SameEndpoint(m) {
		g.membersMu.Unlock()
		nmc.close()
		return cur.touch(), nil
	} else if cur != nil {
		cur.close()
	}
	g.members[m.Name] = nmc.touch()
	g.membersMu.Unlock()
	return nmc, nil
}

// memberByName returns the known state of a pinned member, nil when the
// gateway has none (never used, or forgotten).
func (g *Gateway) memberByName(name string) *memberConn {
	g.membersMu.RLock()
	mc := g.members[name]
	g.membersMu.RUnlock()
	if mc != nil {
		mc.touch()
	}
	return mc
}

// ForgetMember drops the gateway's state for a member removed from the pool
// and closes its idle keep-alive connections. Pins to it are abandoned: the
// next request of those sessions leases afresh. Open tunnels are untouched.
func (g *Gateway) ForgetMember(name string) {
	g.membersMu.Lock()
	mc := g.members[name]
	delete(g.members, name)
	g.membersMu.Unlock()
	if mc != nil {
		mc.close()
	}
}

// ForgetIdleMembers forgets (as ForgetMember does) every member no request
// has taken for longer than idle, and returns their names. A gateway whose
// members come from a remote lease API never hears that one left the pool,
// so without this its per-member state would only grow; a member still in
// the pool is simply set up again on its next use.
func (g *Gateway) ForgetIdleMembers(idle time.Duration) []string {
	cutoff := time.Now().Add(-idle).UnixNano()
	var gone []*memberConn
	g.membersMu.Lock()
	for name, mc := range g.members {
		if mc.lastUsed.Load() < cutoff {
			delete(g.members, name)
			gone = append(gone, mc)
		}
	}
	g.membersMu.Unlock()
	names := make([]string, len(gone))
	for i, mc := range gone {
		mc.close()
		names[i] = mc.m.Name
	}
	return names
}

func (g *Gateway) newMemberConn(m pool.Member) (*memberConn, error) {
	mc := &memberConn{m: m, nameHdr: []string{m.Name}}
	tr := &http.Transport{
		// Never ProxyFromEnvironment: the gateway is the proxy.
		Proxy:                  nil,
		TLSHandshakeTimeout:    g.dialTimeout,
		DisableCompression:     true, // pass encodings through untouched
		MaxIdleConnsPerHost:    maxIdlePerHost,
		IdleConnTimeout:        idleConnTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		// The default answer timeout, from the request's write (send).
		ResponseHeaderTimeout: g.answerTimeout,
	}
	if g.siteRoots != nil {
		// The gateway's own TLS to sites (MITM'd tunnels, https:// URIs)
		// verifies against these; an https:// member's certificate too
		// when the transport reaches it, which classifySiteTLS tells apart.
		tr.TLSClientConfig = &tls.Config{RootCAs: g.siteRoots, MinVersion: tls.VersionTLS12}
	}
	mc.transport = tr
	if m.URL == nil {
		if m.SourceAddr.IsValid() {
			mc.local = &net.TCPAddr{IP: m.SourceAddr.AsSlice(), Zone: m.SourceAddr.Zone()}
		}
		tr.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) {
			return wrapOrder(wrapRaw(g.dialDirectAddr(ctx, mc, addr)))
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
	fwd := &net.Dialer{Timeout: g.dialTimeout}
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
			return &attemptError{f: rotation.UpstreamAnswer(res.StatusCode, ue),
				err: &answerError{status: res.StatusCode, line: echo.Quote(res.Status), ue: ue, connect: true}}
		}
	}
	if u.User != nil {
		user := u.User.Username()
		pass, _ := u.User.Password()
		mc.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	if u.Scheme == "http" {
		mc.lean = newUpstreamPool(mc.upstreamAddr, g.dialTimeout)
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
func (g *Gateway) dialDirectAddr(ctx context.Context, mc *memberConn, addr string) (net.Conn, error) {
	host, port, err := splitTarget(addr, "")
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if ca, ok := ctx.Value(checkedKey{}).(*checkedAddrs); ok && ca.host == host {
		addrs = ca.addrs
	}
	return g.dialDirect(ctx, mc, host, port, addrs)
}

// dialDirect dials the target from the member's source address. addrs are
// the checked addresses; nil means resolve (and check) now.
func (g *Gateway) dialDirect(ctx context.Context, mc *memberConn, host string, port uint16, addrs []netip.Addr) (net.Conn, error) {
	if addrs == nil {
		var err error
		if addrs, err = g.checkTarget(ctx, host, port); err != nil {
			return nil, err
		}
		if addrs == nil { // private targets allowed: resolve without the range check
			if addrs, err = g.resolve(ctx, host); err != nil {
				return nil, err
			}
			if err := g.checkAddrs(host, port, addrs); err != nil {
				return nil, err
			}
		}
	}
	src := mc.m.SourceAddr
	d := net.Dialer{Timeout: g.dialTimeout}
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
