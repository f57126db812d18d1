package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
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

// siteLinks are a tunnel's own site connections, by member name.
type siteLinks struct {
	mu      sync.Mutex
	links   map[string]*siteLink
	opening map[string]chan struct{} // a member's first link being opened
	closed  bool
}

// siteLink is one TLS connection to the site through one member, speaking
// HTTP/1.1 (one exchange at a time) or HTTP/2.
type siteLink struct {
	member string
	c      net.Conn
	br     *bufio.Reader // HTTP/1.1, reading through hr
	hr     headReader    // bounds each answer head br reads
	fh     *siteH2       // HTTP/2, opened with the client's frames (h2Print)
	busy   bool          // HTTP/1.1: an answer is being read
}

func (l *siteLink) close() {
	if l.fh != nil {
		l.fh.close()
	}
	_ = l.c.Close()
}

// take returns the member's link when it can carry a request now (an
// HTTP/1.1 one marked busy). Without one it returns wait, when another
// request is opening the member's first link (HTTP/2 carries both: one
// site connection, as a browser has), or opener: the caller opens it and
// calls opened.
func (s *siteLinks) take(member string) (l *siteLink, wait <-chan struct{}, opener bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.links[member]
	switch {
	case l == nil:
		if ch, ok := s.opening[member]; ok {
			return nil, ch, false
		}
		if s.opening == nil {
			s.opening = map[string]chan struct{}{}
		}
		s.opening[member] = make(chan struct{})
		return nil, nil, true
	case l.fh != nil:
		if l.fh.canTake() {
			return l, nil, false
		}
	case !l.busy:
		l.busy = true
		return l, nil, false
	}
	return nil, nil, false
}

// opened ends the opening of the member's first link, which add has
// kept or which failed: the requests waiting for it look again.
func (s *siteLinks) opened(member string) {
	s.mu.Lock()
	if ch, ok := s.opening[member]; ok {
		close(ch)
		delete(s.opening, member)
	}
	s.mu.Unlock()
}

// add keeps l as the member's link (replacing one that cannot take
// requests, which closes when its exchange ends); false once the client's
// connection closed.
func (s *siteLinks) add(l *siteLink) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.links == nil {
		s.links = map[string]*siteLink{}
	}
	s.links[l.member] = l
	return true
}

// release makes an HTTP/1.1 link free for the tunnel's next request.
func (s *siteLinks) release(l *siteLink) {
	s.mu.Lock()
	if s.links[l.member] == l && !s.closed {
		l.busy = false
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	l.close()
}

// drop closes l and forgets it.
func (s *siteLinks) drop(l *siteLink) {
	s.mu.Lock()
	if s.links[l.member] == l {
		delete(s.links, l.member)
	}
	s.mu.Unlock()
	l.close()
}

// closeAll closes every link: the client's connection closed.
func (s *siteLinks) closeAll() {
	s.mu.Lock()
	s.closed = true
	links := s.links
	s.links = nil
	s.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// sendMirrored is send for a request of a mirroring tunnel: through the
// tunnel's link for mc's member, opened now when there is none. A request
// that may be sent again goes out once more on a new link when a reused
// one turns out closed before answering, or answers what does not parse
// (leftover).
func (x *exchange) sendMirrored(t *innerTunnel, mc *memberConn, out *http.Request, timeout time.Duration) (*http.Response, error) {
	for try := 0; ; try++ {
		l, wait, opener := t.sites.take(mc.m.Name)
		if wait != nil {
			select {
			case <-wait:
				try--
				continue
			case <-out.Context().Done():
				return nil, errClientGone
			}
		}
		reused := l != nil
		if l == nil {
			var err error
			l, err = x.openSiteLink(out.Context(), t, mc, timeout)
			if err == nil && !t.sites.add(l) {
				l.close()
				err = errClientGone
			}
			if opener {
				t.sites.opened(mc.m.Name)
			}
			if err != nil {
				return nil, err
			}
		}
		resp, err := x.linkRoundTrip(t, l, out, timeout)
		if err == nil {
			return resp, nil
		}
		t.sites.drop(l)
		if reused && try == 0 && (staleLink(err) || (l.fh == nil && leftover(err))) && link.Replayable(out) && (out.Body == nil || out.Body == http.NoBody) {
			continue
		}
		return nil, err
	}
}

// staleLink reports the error of a kept-alive connection the site had
// closed before the request reached it.
func staleLink(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || isNoCachedConn(err)
}

// leftover reports an answer on a kept-alive link that does not parse:
// most likely bytes the site sent after its last answer's end (a body on
// a 304, more than its Content-Length) that arrived after the link was
// given back, read as the start of this answer. The keep-alive pool
// (internal/keepalive) sends again after a stale connection the same way.
func leftover(err error) bool {
	var mh *malformedHead
	return errors.As(err, &mh)
}

// openSiteLink connects to the tunnel's site through mc and completes the
// mirrored handshake.
func (x *exchange) openSiteLink(ctx context.Context, t *innerTunnel, mc *memberConn, timeout time.Duration) (*siteLink, error) {
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
		tc, proto, err = x.siteTLS(ctx, c, t, mc.m.Name, speaksForward)
		if errors.Is(err, errFellBack) {
			continue // a new connection through the same member, with a preset
		}
		if err != nil {
			return nil, err
		}
		break
	}
	l := &siteLink{member: mc.m.Name, c: tc, busy: true}
	if proto == "h2" {
		p := t.h2.Load()
		if p == nil {
			p = goH2Print
		}
		var err error
		if l.fh, err = p.open(tc); err != nil {
			_ = tc.Close()
			return nil, fault.Site(rotation.Site("tls"), errors.New("HTTP/2 to the site: "+err.Error()))
		}
		return l, nil
	}
	l.hr = newHeadReader(tc)
	l.br = bufio.NewReaderSize(&l.hr, 4096)
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
		cfg.ApplicationSettings = map[string][]byte{"h2": p.alps()}
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

// linkRoundTrip sends out on l and returns the answer; its body gives
// the link back to the tunnel when read to its end.
func (x *exchange) linkRoundTrip(t *innerTunnel, l *siteLink, out *http.Request, timeout time.Duration) (*http.Response, error) {
	if l.fh != nil {
		actx, cancel := context.WithCancelCause(out.Context())
		timer := time.AfterFunc(timeout, func() { cancel(fault.ErrAnswerTimeout) })
		resp, err := l.fh.roundTrip(out.WithContext(actx))
		if !timer.Stop() {
			if err == nil {
				_ = resp.Body.Close()
			}
			cancel(nil)
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		if err != nil {
			cancel(nil)
			return nil, err
		}
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	ctx := out.Context()
	stop := context.AfterFunc(ctx, func() { _ = l.c.SetDeadline(keepalive.ALongTimeAgo) })
	if err := x.writeRequest(l.c, out, false); err != nil {
		stop()
		return nil, err
	}
	_ = l.c.SetReadDeadline(time.Now().Add(timeout))
	resp, err := readFinalHead(l.br, &l.hr, out)
	if err != nil {
		stop()
		if fault.IsTimeout(err) && ctx.Err() == nil {
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		// Past the site's TLS the member relays encrypted bytes only: what
		// they say is the site's.
		return nil, siteHeadFault(err, true)
	}
	_ = l.c.SetReadDeadline(time.Time{})
	resp.Body = &linkBody{rc: resp.Body, done: func(complete bool) {
		stop()
		// Bytes read past the answer's end (a site that sends a body on a
		// 304, or more than its Content-Length) would be read as the start
		// of the next answer: such a link is not reused.
		if complete && !resp.Close && l.br.Buffered() == 0 {
			t.sites.release(l)
		} else {
			t.sites.drop(l)
		}
	}}
	return resp, nil
}

// linkBody is an HTTP/1.1 answer's body on a tunnel's link: read to its
// end it frees the link, closed early or broken it closes it.
type linkBody struct {
	rc   io.ReadCloser
	done func(complete bool)
	over bool
}

func (b *linkBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && !b.over {
		b.over = true
		b.done(err == io.EOF)
	}
	return n, err
}

// Close ends the body; unread, the link is closed rather than drained.
func (b *linkBody) Close() error {
	if !b.over {
		b.over = true
		b.done(false)
	}
	return nil
}

// cancelBody ends an HTTP/2 answer's context with its body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
