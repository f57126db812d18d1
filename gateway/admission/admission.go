// Package admission is the first stage of every request through the
// gateway: it authenticates the client (its token against the configured
// ones, in constant time), reads its parameters (gateway/params) and
// checks its target: no private range unless allowed, never the gateway's
// own listen address, resolved through a short cache of checked answers.
// It calls no other stage; a direct member's dial asks it for a target's
// addresses (DialAddrs, link.TargetChecker).
package admission

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
)

// Admission is the first stage of every request: it authenticates the
// client, reads its parameters and checks its target (not a private
// range unless allowed, not the gateway itself). It owns the client
// tokens, the DNS answers it checked (cached briefly) and the addresses
// the gateway listens on; it calls no other stage.
type Admission struct {
	tokens       tokenSet
	names        []string // names[i]: the client of tokens[i]
	authRequired bool
	allowPrivate bool
	// cluster are the private ranges admitted all the same (Options.Cluster).
	cluster  []netip.Prefix
	resolver Resolver
	dns      dnsCache
	// listen holds the addresses Serve listens on, for the loop check.
	listen atomic.Pointer[[]netip.AddrPort]
}

// Resolver looks up a target's addresses (*net.Resolver implements it).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure the admission stage.
type Options struct {
	// Clients are the token clients (none: no authentication).
	Clients []clients.Client
	// AllowPrivate lets targets in every private range through.
	AllowPrivate bool
	// Cluster are the private ranges admitted all the same (a cluster's
	// own pod and service ranges, checked by clustertargets.Check).
	Cluster []netip.Prefix
	// Resolver looks targets up.
	Resolver Resolver
}

// New returns the admission stage.
func New(o Options) *Admission {
	tokens := make([]string, len(o.Clients))
	names := make([]string, len(o.Clients))
	for i, c := range o.Clients {
		tokens[i], names[i] = c.Token, c.Name
	}
	return &Admission{tokens: newTokenSet(tokens), names: names, authRequired: len(o.Clients) > 0, allowPrivate: o.AllowPrivate, cluster: o.Cluster, resolver: o.Resolver}
}

// AuthError is a client whose token the gateway refuses before leasing:
// 407 auth. (A malformed parameter or credential is a *params.Error: 407
// bad_params.)
type AuthError struct {
	Err error
}

func (e *AuthError) Error() string { return e.Err.Error() }

func authFailed(err error) error { return &AuthError{Err: err} }

// Listening adds addr (a listener's) to the addresses the loop check refuses.
func (ad *Admission) Listening(addr net.Addr) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return
	}
	for {
		old := ad.listen.Load()
		var next []netip.AddrPort
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		if ad.listen.CompareAndSwap(old, &next) {
			return
		}
	}
}

// Authenticate checks the client's token (when token clients are
// configured), reads its parameters and names its token client in them
// (Params.Client). The token never reaches a log or an error text. A
// refused token is an *AuthError; a malformed parameter or credential is
// the parser's *params.Error, which the gateway's judge answers as bad_params.
func (ad *Admission) Authenticate(r *http.Request) (params.Params, error) {
	var user, client string
	pa := r.Header["Proxy-Authorization"]
	switch {
	case len(pa) > 1:
		return params.Params{}, &params.Error{Msg: "Proxy-Authorization given more than once"}
	case len(pa) == 1:
		u, token, err := params.ParseProxyAuthorization(pa[0])
		if err != nil {
			if ad.authRequired {
				return params.Params{}, authFailed(err)
			}
			return params.Params{}, err
		}
		if ad.authRequired {
			i := ad.tokens.match(token)
			if i < 0 {
				return params.Params{}, authFailed(errors.New("proxy authentication failed: unknown token"))
			}
			client = ad.names[i]
		}
		user = u
	case ad.authRequired:
		return params.Params{}, authFailed(errors.New("proxy authentication required: send Proxy-Authorization: Basic base64(user:token)"))
	}
	up, err := params.ParseUsername(user)
	if err != nil {
		return params.Params{}, err
	}
	hp, err := params.ParseHeaders(r.Header)
	if err != nil {
		return params.Params{}, err
	}
	p, err := params.Merge(up, hp)
	p.Client = client
	return p, err
}

var (
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	reserved4 = netip.MustParsePrefix("240.0.0.0/4")
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
)

// forbiddenReason says why a is not a target the gateway will reach by
// default ("" when it is fine): loopback, private (RFC 1918, CGNAT,
// unique-local), link-local (the cloud metadata address), unspecified,
// multicast and reserved ranges. IPv4-mapped and NAT64 addresses are judged
// by the IPv4 address they carry.
func forbiddenReason(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() && nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate(), cgnat.Contains(a):
		return "a private address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsUnspecified(), thisNet.Contains(a):
		return "an unspecified address"
	case a.IsMulticast():
		return "a multicast address"
	case reserved4.Contains(a):
		return "a reserved address"
	}
	return ""
}

// CheckTarget resolves host (IP literals need no lookup) and refuses it when
// any address is in a forbidden range (unless private targets are allowed)
// or is the gateway's own listen address. It returns the checked addresses,
// or nil when private targets are allowed and host is a name: then nothing
// was resolved and a direct member resolves when it dials.
func (ad *Admission) CheckTarget(ctx context.Context, host string, port uint16) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" && !ad.allowPrivate {
			return nil, &fault.Target{Reason: fault.ReasonPrivateTarget, Msg: "target " + echo.Quote(host) + " has an IPv6 zone; refused"}
		}
		addrs := []netip.Addr{a.Unmap()}
		return addrs, ad.checkAddrs(host, port, addrs)
	}
	if ad.allowPrivate {
		return nil, nil
	}
	addrs, err := ad.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	return addrs, ad.checkAddrs(host, port, addrs)
}

// DialAddrs are the addresses a direct member dials for host:port: the
// checked ones, resolved here when CheckTarget had no need to (private
// targets allowed), the loop check applied to them either way.
func (ad *Admission) DialAddrs(ctx context.Context, host string, port uint16) ([]netip.Addr, error) {
	addrs, err := ad.CheckTarget(ctx, host, port)
	if err != nil || addrs != nil {
		return addrs, err
	}
	if addrs, err = ad.resolve(ctx, host); err != nil {
		return nil, err
	}
	return addrs, ad.checkAddrs(host, port, addrs)
}

// resolve looks host up (answers are cached briefly, see dnsCache); a
// failure is a 502 naming the host.
func (ad *Admission) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if addrs, ok := ad.dns.get(host); ok {
		return addrs, nil
	}
	addrs, err := ad.resolver.LookupNetIP(ctx, "ip", host)
	if err == nil && len(addrs) == 0 {
		return nil, &fault.Target{Reason: fault.ReasonDNS, Msg: "cannot resolve " + echo.Quote(host) + ": no addresses"}
	}
	if err != nil {
		return nil, &fault.Target{Reason: fault.ReasonDNS, Msg: "cannot resolve " + echo.Quote(host) + ": " + err.Error()}
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	ad.dns.put(host, addrs)
	return addrs, nil
}

const (
	// dnsCacheTTL is how long a lookup answer is reused. Go's resolver does
	// not cache, and a lookup per request would add a DNS round trip to
	// every request; the answer is still checked on every use.
	dnsCacheTTL = 30 * time.Second
	// dnsCacheEntries bounds the cache; when full it starts over.
	dnsCacheEntries = 8192
)

// dnsCache keeps successful lookups for dnsCacheTTL. Failures are not cached.
type dnsCache struct {
	mu sync.RWMutex
	m  map[string]dnsEntry
}

type dnsEntry struct {
	addrs   []netip.Addr
	expires time.Time
}

func (c *dnsCache) get(host string) ([]netip.Addr, bool) {
	c.mu.RLock()
	e, ok := c.m[host]
	c.mu.RUnlock()
	if !ok || time.Now().After(e.expires) {
		return nil, false
	}
	return e.addrs, true
}

func (c *dnsCache) put(host string, addrs []netip.Addr) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= dnsCacheEntries {
		c.m = make(map[string]dnsEntry)
	}
	c.m[host] = dnsEntry{addrs: addrs, expires: time.Now().Add(dnsCacheTTL)}
	c.mu.Unlock()
}

// checkAddrs applies the range and loop checks to every address of host.
func (ad *Admission) checkAddrs(host string, port uint16, addrs []netip.Addr) error {
	for _, a := range addrs {
		if !ad.allowPrivate {
			// The ranges first: most targets are public, and only an
			// address they refuse needs the cluster's own ranges.
			if why := forbiddenReason(a); why != "" && !clustertargets.Contains(ad.cluster, a) {
				return &fault.Target{Reason: fault.ReasonPrivateTarget,
					Msg: "target " + echo.Quote(host) + " resolves to " + a.String() + ", " + why + "; refused (private targets are not allowed: the gateway's --cluster-target-cidrs admits a cluster's own pod and service ranges, --allow-private-targets all of them)"}
			}
		}
		if ad.isSelf(a, port) {
			return &fault.Target{Reason: fault.ReasonLoop,
				Msg: "target " + echo.Quote(host) + " is this gateway's own listen address " + netip.AddrPortFrom(a, port).String() + "; refused"}
		}
	}
	return nil
}

// isSelf reports whether a:port is where this gateway listens (directly, or
// through an unspecified listen address that covers every local address).
// An unspecified target (0.0.0.0, ::) is this host too: a connection to it
// reaches the loopback listener on its port, so any listener on that port
// counts.
func (ad *Admission) isSelf(a netip.Addr, port uint16) bool {
	lp := ad.listen.Load()
	if lp == nil {
		return false
	}
	a = a.WithZone("").Unmap()
	for _, l := range *lp {
		if l.Port() != port {
			continue
		}
		if l.Addr().Unmap() == a || a.IsUnspecified() {
			return true
		}
		if l.Addr().IsUnspecified() && (a.IsLoopback() || a.IsUnspecified() || isLocalAddr(a)) {
			return true
		}
	}
	return false
}

// isLocalAddr reports whether a is assigned to one of this host's
// interfaces. Only asked when a target's port equals a wildcard listen port.
func isLocalAddr(a netip.Addr) bool {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ifa := range ifas {
		if p, err := netip.ParsePrefix(ifa.String()); err == nil && p.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// tokenSet checks client tokens in constant time: every configured token is
// compared (as a SHA-256 digest, so lengths leak nothing) whatever matches.
type tokenSet [][sha256.Size]byte

func newTokenSet(tokens []string) tokenSet {
	s := make(tokenSet, 0, len(tokens))
	for _, t := range tokens {
		s = append(s, sha256.Sum256([]byte(t)))
	}
	return s
}

// match is the index of token in s, or -1: every token is compared, and
// the index kept without a branch on the comparison.
func (s tokenSet) match(token string) int {
	got := sha256.Sum256([]byte(token))
	found := -1
	for i := range s {
		eq := subtle.ConstantTimeCompare(got[:], s[i][:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	return found
}
