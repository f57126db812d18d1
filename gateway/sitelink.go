package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/internal/rawio"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Under --mitm-fingerprint mirror a site connection belongs to one client
// connection: a MITM tunnel keeps its own connections to its site, one
// per member its requests went through, opened by the first request that
// needs one (with the client's ClientHello mirrored) and closed with the
// client's connection. A site never sees two clients' requests on one TLS
// session. --mitm-fingerprint go keeps the member's Transport, which pools
// its connections across clients.

// Fingerprint is the site-facing TLS handshake under MITM.
type Fingerprint string

const (
	// FingerprintMirror sends the site a ClientHello built from the
	// client's (gateway/mirror), over a site connection of the client's own.
	FingerprintMirror Fingerprint = "mirror"
	// FingerprintGo sends Go's crypto/tls ClientHello, over connections
	// pooled across clients.
	FingerprintGo Fingerprint = "go"
)

// ParseFingerprint reads a --mitm-fingerprint or X-Proxyfleet-Fingerprint
// value. A build without mirroring (mirror.Available false: the lean
// sidecar) refuses mirror, naming the build that has it.
func ParseFingerprint(s string) (Fingerprint, error) {
	switch Fingerprint(s) {
	case FingerprintMirror:
		if !mirror.Available {
			return "", errors.New("fingerprint mirror: this build (the lean sidecar, -tags nomirror) leaves ClientHello mirroring out; use go, or /proxyfleet-mitm of the sidecar image (what the injection webhook runs for proxyfleet.io/mitm pods)")
		}
		return FingerprintMirror, nil
	case FingerprintGo:
		return FingerprintGo, nil
	}
	return "", errors.New("fingerprint " + echo.Quote(s) + ": want mirror or go")
}

// speaksForward are the ALPN protocols the gateway speaks to a site for a
// forwarded request: a site that picks h2 gets HTTP/2 (fhttp).
func speaksForward(p string) bool { return p == "h2" || p == "http/1.1" || p == "http/1.0" }

// speaksUpgrade are the ALPN protocols a WebSocket handshake can use: the
// gateway relays its bytes after 101, which HTTP/2 has not.
func speaksUpgrade(p string) bool { return p == "http/1.1" }

// sendMirrored is send for a request of a mirroring tunnel: through the
// tunnel's link for mc's member, opened now when there is none. A request
// that may be sent again goes out once more on a new link when a reused
// one turns out closed before answering, or answers what does not parse
// (leftover).
func (x *exchange) sendMirrored(t *innerTunnel, mc *link.Link, out *http.Request, timeout time.Duration) (*http.Response, error) {
	for try := 0; ; try++ {
		l, wait, opener := t.sites.Take(mc.Member.Name)
		if wait != nil {
			select {
			case <-wait:
				try--
				continue
			case <-out.Context().Done():
				return nil, fault.ErrClientGone
			}
		}
		reused := l != nil
		if l == nil {
			var err error
			l, err = x.openSiteLink(out.Context(), t, mc, timeout)
			if err == nil && !t.sites.Add(l) {
				l.Close()
				err = fault.ErrClientGone
			}
			if opener {
				t.sites.Opened(mc.Member.Name)
			}
			if err != nil {
				return nil, err
			}
		}
		resp, err := t.sites.RoundTrip(l, out, timeout, x)
		if err == nil {
			return resp, nil
		}
		t.sites.Drop(l)
		if reused && try == 0 && (sitelink.Stale(err) || (!l.H2() && sitelink.Leftover(err))) && link.Replayable(out) && (out.Body == nil || out.Body == http.NoBody) {
			continue
		}
		return nil, err
	}
}

// openSiteLink connects to the tunnel's site through mc and completes the
// mirrored handshake.
func (x *exchange) openSiteLink(ctx context.Context, t *innerTunnel, mc *link.Link, timeout time.Duration) (*sitelink.Link, error) {
	addrs := link.Checked(ctx, t.host)
	var (
		tc    net.Conn
		proto string
	)
	for {
		c, early, err := x.links.dialConnect(ctx, mc, t.hostport, t.host, t.port, addrs, timeout)
		if err != nil {
			return nil, err
		}
		// TLS records to and from the site without a runtime system call each
		// (internal/rawio), as the client's side of the tunnel.
		c = rawio.Wrap(c)
		if len(early) > 0 {
			c = &prefixConn{Conn: c, prefix: early}
		}
		tc, proto, err = x.siteTLS(ctx, c, t, mc.Member.Name, speaksForward)
		if errors.Is(err, errFellBack) {
			continue // a new connection through the same member, with a preset
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if proto != "h2" {
		return sitelink.NewLink(mc.Member.Name, tc), nil
	}
	p := t.h2.Load()
	if p == nil {
		p = sitelink.GoH2Print
	}
	l, err := sitelink.NewH2Link(mc.Member.Name, tc, p)
	if err != nil {
		_ = tc.Close()
		return nil, fault.Site(rotation.Site("tls"), errors.New("HTTP/2 to the site: "+err.Error()))
	}
	return l, nil
}

// siteTLS completes the site-facing handshake over c (through member)
// with the tunnel's ClientHello (or the fallback preset), offering the ALPN
// protocols of the client's list that speaks allows, and returns the
// connection and the protocol the site chose. c is closed on an error.
func (x *exchange) siteTLS(ctx context.Context, c net.Conn, t *innerTunnel, member string, speaks func(string) bool) (net.Conn, string, error) {
	hctx, cancel := context.WithTimeout(ctx, x.dialTimeout)
	defer cancel()
	_ = c.SetDeadline(time.Now().Add(x.dialTimeout))
	hello, preset := t.siteHello(x)
	cfg := mirror.Config{Host: t.host, Roots: x.siteRoots, Hello: hello, Preset: preset, Speaks: speaks,
		Resumption: t.siteResumption(x, member)}
	if p := t.h2.Load(); p != nil {
		cfg.ApplicationSettings = map[string][]byte{"h2": p.ALPS()}
	}
	u, err := mirror.Client(hctx, c, cfg)
	if err != nil {
		_ = c.Close()
		var oe *mirror.OwnError
		if errors.As(err, &oe) {
			return nil, "", x.ownHandshakeFailed(t, member, hello, preset, oe)
		}
		if fault.IsCertError(err) {
			return nil, "", fault.SiteCertificate(t.host, err)
		}
		return nil, "", fault.Site(rotation.Site("tls"), errors.New("TLS to the site: "+err.Error()))
	}
	_ = c.SetDeadline(time.Time{})
	x.rec.MITMHandshake(LegSite, u.Resumed())
	return u, u.Protocol(), nil
}

// errFellBack is a site handshake the gateway's TLS library could not
// complete with the hello it built (mirror.OwnError): the tunnel has
// moved on to a preset and the caller opens a new connection through the
// same member at once. It blames no one: judge never sees it.
var errFellBack = errors.New("the site handshake falls back to a preset")

// classOwnTLS is the failure class of a site handshake the gateway's TLS
// library could complete with none of the hellos it tried: the gateway's
// own failure, which rests no member or site and tries no other member.
const classOwnTLS = "tls_gateway"

// maxPresetTries bounds the presets one tunnel tries after its client's
// hello could not be completed (each costs a connection through the
// member); a preset completing against a site that took the client's
// hello is the rule, the second one the exception.
const maxPresetTries = 2

// helloFallback is where a mirroring tunnel stands after a site handshake
// its hello could not complete: the preset its site connections use from
// then on, and the next ones to try.
type helloFallback struct {
	mu   sync.Mutex
	on   bool
	cur  mirror.Preset
	next []mirror.Preset
}

// siteHello is the hello of the tunnel's next site connection: the
// client's, mirrored (preset unused), or a preset (hello nil) once the
// client's could not be mirrored or completed.
func (t *innerTunnel) siteHello(x *exchange) (*mirror.Hello, mirror.Preset) {
	t.fb.mu.Lock()
	on, cur := t.fb.on, t.fb.cur
	t.fb.mu.Unlock()
	if on {
		return nil, cur
	}
	return t.helloFor(x), x.mitm.preset
}

// ownHandshakeFailed answers a site handshake through member that failed
// on the gateway's side (oe) with hello (nil: preset): the tunnel moves
// on to the closest preset not tried, saying so in the log and the
// metric, and errFellBack has the caller try it at once; with none left it
// is the gateway's own failure, a 502 that blames no one.
func (x *exchange) ownHandshakeFailed(t *innerTunnel, member string, hello *mirror.Hello, preset mirror.Preset, oe *mirror.OwnError) error {
	t.fb.mu.Lock()
	if !t.fb.on {
		var order []mirror.Preset
		if hello != nil {
			order = mirror.Closest(hello, x.mitm.preset)
		} else {
			// The fallback preset of an unmirrorable hello failed itself.
			order = slices.DeleteFunc(mirror.Closest(nil, preset), func(p mirror.Preset) bool { return p == preset })
		}
		t.fb.on, t.fb.cur, t.fb.next = true, preset, order[:min(len(order), maxPresetTries)]
	} else if hello != nil || t.fb.cur != preset {
		// Another of the tunnel's connections moved on already.
		t.fb.mu.Unlock()
		return errFellBack
	}
	if len(t.fb.next) == 0 {
		t.fb.mu.Unlock()
		x.log.Warn("the gateway's TLS library completed no hello it tried with the site: answered 502, blaming no member and no site",
			"target", t.host, "member", member, "preset", preset.Name, "reason", oe.Reason, "err", oe.Err)
		return &fault.Attempt{F: rotation.Site(classOwnTLS), Firsthand: true,
			Err: errors.New("the gateway's TLS to the site could not complete its own handshake: " + oe.Err.Error())}
	}
	t.fb.cur, t.fb.next = t.fb.next[0], t.fb.next[1:]
	next := t.fb.cur
	t.fb.mu.Unlock()
	from := "preset " + preset.Name
	if hello != nil {
		from = "the client's (JA3 " + hello.JA3() + ")"
		// The metric counts tunnels that left their client's hello; a
		// preset after a preset is in the log only.
		x.rec.MITMHelloFallback(oe.Reason)
	}
	x.log.Info("the site handshake with the hello the gateway built failed on the gateway's side: going on through the same member with a preset, blaming no one",
		"target", t.host, "member", member, "hello", from, "preset", next.Name, "reason", oe.Reason, "err", oe.Err)
	return errFellBack
}
