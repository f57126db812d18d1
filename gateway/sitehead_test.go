//go:build !nomirror

package gateway

import (
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/pool"
)

// endlessHead answers with status and then header lines, 16 MiB of them
// unless the gateway stops reading first.
func endlessHead(status string) func(int, net.Conn) bool {
	line := []byte(strings.Repeat("X-Junk: "+strings.Repeat("a", 1014)+"\r\n", 64))
	return func(_ int, c net.Conn) bool {
		if _, err := io.WriteString(c, "HTTP/1.1 "+status+"\r\n"); err != nil {
			return false
		}
		for sent := 0; sent < 16<<20; sent += len(line) {
			if _, err := c.Write(line); err != nil {
				return false
			}
		}
		return false
	}
}

// wsHandshake is a WebSocket opening handshake for target (origin form
// when target has no scheme).
func wsHandshake(target, host string) string {
	return "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
}

// siteExchange sends one request to the site at addr through the gateway:
// inside a MITM'd tunnel when https (then request is in origin form), else
// on the proxy port in absolute form; it returns the gateway's answer.
func siteExchange(t *testing.T, e *env, https bool, addr string, caRoots *x509.CertPool, request func(site string) string) (*http.Response, string) {
	t.Helper()
	if https {
		rc := mitmRawConn(t, e.addr, &url.URL{Scheme: "https", Host: addr}, caRoots)
		rc.send(request(""))
		return rc.answer(http.MethodGet)
	}
	rc := dialRaw(t, e.addr)
	rc.send(request("http://" + addr))
	return rc.answer(http.MethodGet)
}

// TestSiteAnswerHeadIsBoundedOnEveryPath: a site whose answer head never
// ends is cut off at 1 MiB on the paths that read a site's head themselves
// (a MITM'd request on the tunnel's own site link, a WebSocket handshake
// inside a MITM'd tunnel and in plain ws://), and the client gets 502
// target_unreachable saying so. It is the site's: no member rests for
// every site; where the gateway read the head itself (its own TLS to the
// site, a direct member's address) no member rests even for the site and
// none other is tried, while a head a proxy member relayed in plain HTTP
// rests that member for the site only.
func TestSiteAnswerHeadIsBoundedOnEveryPath(t *testing.T) {
	tests := []struct {
		name        string
		https       bool
		proxy       bool // through a relaying proxy member, else a direct one
		request     func(site string) string
		status      string
		wantResting int
		// fingerprint is the MITM's (default mirror); go reads the site
		// through the member's Transport.
		fingerprint Fingerprint
		// absoluteHTTPS sends GET https://site/ on the proxy port: the
		// Transport's own TLS to the site, no MITM.
		absoluteHTTPS bool
	}{
		{name: "a MITM'd request through a direct member", https: true,
			request: func(string) string { return "GET / HTTP/1.1\r\nHost: x\r\n\r\n" }, status: "200 OK"},
		{name: "a MITM'd request through a proxy member", https: true, proxy: true,
			request: func(string) string { return "GET / HTTP/1.1\r\nHost: x\r\n\r\n" }, status: "200 OK"},
		{name: "a MITM'd request through a proxy member under the go fingerprint", https: true, proxy: true, fingerprint: FingerprintGo,
			request: func(string) string { return "GET / HTTP/1.1\r\nHost: x\r\n\r\n" }, status: "200 OK"},
		{name: "an https:// absolute URI through a proxy member", proxy: true, absoluteHTTPS: true,
			request: func(string) string { return "GET / HTTP/1.1\r\nHost: x\r\n\r\n" }, status: "200 OK"},
		{name: "a wss handshake through a proxy member", https: true, proxy: true,
			request: func(string) string { return wsHandshake("/ws", "x") }, status: "101 Switching Protocols"},
		{name: "a ws handshake through a direct member",
			request: func(site string) string { return wsHandshake(site+"/ws", "x") }, status: "101 Switching Protocols"},
		{name: "a ws handshake a proxy member relays", proxy: true,
			request: func(site string) string { return wsHandshake(site+"/ws", "x") }, status: "101 Switching Protocols", wantResting: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			site, roots := scriptedSite(t, tt.https || tt.absoluteHTTPS, endlessHead(tt.status))
			member := directMembers(1)[0]
			if tt.proxy {
				member = relayingUpstream(t, "p1")
			}
			fp := tt.fingerprint
			if fp == "" {
				fp = FingerprintMirror
			}
			ca, caRoots := newTestCA(t)
			e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: roots,
				MITM: &MITMOptions{CA: ca, Fingerprint: fp}}, pool.StoreOptions{}, member)
			var resp *http.Response
			var b string
			if tt.absoluteHTTPS {
				rc := dialRaw(t, e.addr)
				rc.send("GET https://" + site + "/ HTTP/1.1\r\nHost: " + site + "\r\n\r\n")
				resp, b = rc.answer(http.MethodGet)
			} else {
				resp, b = siteExchange(t, e, tt.https, site, caRoots, tt.request)
			}
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != fault.ReasonTargetUnreachable ||
				!strings.Contains(b, "larger than 1 MiB") {
				t.Fatalf("got %d %s %q; want 502 %s saying the head is larger than 1 MiB",
					resp.StatusCode, resp.Header.Get(HeaderReason), b, fault.ReasonTargetUnreachable)
			}
			if mw := memberWide(e.store); len(mw) != 0 {
				t.Fatalf("%v rest for every site; the head was the site's", mw)
			}
			if n := restingFor(e.store, "127.0.0.1"); n != tt.wantResting {
				t.Fatalf("%d members rest for the site, want %d", n, tt.wantResting)
			}
		})
	}
}

// TestMalformedSiteAnswerIsTheSitesFault: an answer that does not parse
// (a garbled status line, two different Content-Lengths) read over the
// gateway's own TLS to the site is the site's: the member only relayed
// encrypted bytes. The client gets 502 target_unreachable saying so, no
// member rests and none other is tried (the site is asked once); read as
// the member's, each member it went through rested for every site.
func TestMalformedSiteAnswerIsTheSitesFault(t *testing.T) {
	for name, raw := range map[string]string{
		"a garbled status line":         "HTTP/1.1 two hundred OK\r\nContent-Length: 2\r\n\r\nok",
		"two different Content-Lengths": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
		"a header line without a colon": "HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 2\r\n\r\nok",
	} {
		for _, fp := range []Fingerprint{FingerprintMirror, FingerprintGo} {
			t.Run(name+"/"+string(fp), func(t *testing.T) { malformedSiteAnswer(t, raw, fp) })
		}
	}
}

func malformedSiteAnswer(t *testing.T, raw string, fp Fingerprint) {
	var asked atomic.Int64
	site, roots := scriptedSite(t, true, func(_ int, c net.Conn) bool {
		asked.Add(1)
		_, _ = io.WriteString(c, raw)
		return false
	})
	ca, caRoots := newTestCA(t)
	e := newEnv(t, Options{AllowPrivateTargets: true, Retries: 2, SiteRoots: roots,
		MITM: &MITMOptions{CA: ca, Fingerprint: fp}}, pool.StoreOptions{},
		relayingUpstream(t, "p1"), relayingUpstream(t, "p2"))
	resp, b := siteExchange(t, e, true, site, caRoots, func(string) string { return "GET / HTTP/1.1\r\nHost: x\r\n\r\n" })
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != fault.ReasonTargetUnreachable ||
		!strings.Contains(b, "the site's malformed answer") {
		t.Fatalf("got %d %s %q; want 502 %s naming the site's malformed answer", resp.StatusCode, resp.Header.Get(HeaderReason), b, fault.ReasonTargetUnreachable)
	}
	if mw := memberWide(e.store); len(mw) != 0 {
		t.Errorf("%v rest for every site; the answer was the site's", mw)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the site was asked %d times, want 1 (another member reads the same answer)", n)
	}
}

// TestMITMSiteLinkWithLeftoverBytesIsNotReused: a site that sends more
// than its answer (a body on a 304) leaves bytes on the tunnel's site
// link. Read with the answer, they keep the link from being reused; sent
// later, after the link was given back, the next request's answer does
// not parse, and the request goes out once more on a new link (the site
// is asked once more). Either way the client gets every answer and no
// member rests.
func TestMITMSiteLinkWithLeftoverBytesIsNotReused(t *testing.T) {
	const notModified = "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	tests := []struct {
		name   string
		answer func(n int) string
		asked  int // requests the site reads
	}{
		{name: "read with the answer", asked: 3, answer: func(n int) string {
			if n == 1 {
				return notModified + "hello"
			}
			return ok
		}},
		{name: "arriving after the link was given back", asked: 4, answer: func(n int) string {
			switch n {
			case 1:
				return notModified
			case 2:
				// Before the second answer, as if late from the first.
				return "hello" + ok
			}
			return ok
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked atomic.Int64
			site, roots := scriptedSite(t, true, writes(&asked, tt.answer))
			ca, caRoots := newTestCA(t)
			e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: roots,
				MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{}, relayingUpstream(t, "p1"))
			c := mitmClient(t, e.addr, caRoots, nil, nil)
			for i, want := range []int{http.StatusNotModified, http.StatusOK, http.StatusOK} {
				a := mitmDo(t, c, http.MethodGet, "https://"+site+"/", nil)
				if a.status != want || (want == http.StatusOK && a.body != "ok") {
					t.Fatalf("request %d: %d %q (%s); want %d", i+1, a.status, a.body, a.header.Get(HeaderReason), want)
				}
			}
			if mw, n := memberWide(e.store), restingFor(e.store, "127.0.0.1"); len(mw) != 0 || n != 0 {
				t.Fatalf("%v rest for every site and %d for this one; want none", mw, n)
			}
			if n := asked.Load(); n != int64(tt.asked) {
				t.Fatalf("the site was asked %d times, want %d", n, tt.asked)
			}
		})
	}
}

// TestWebSocketHandshakeIsJudgedAsARequest: a WebSocket handshake's answer
// is judged as a forwarded request's: interim answers before the 101 are
// skipped, a ban to a strict session ends it session_lost instead of
// moving it to another member, and a 429's Retry-After sets the member's
// rest for the site instead of the default 10 minutes.
func TestWebSocketHandshakeIsJudgedAsARequest(t *testing.T) {
	const switched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
	tests := []struct {
		name       string
		user       string
		answer     func(n int) string
		status     int
		reason     string
		asked      int
		restsUnder time.Duration // the longest rest for the site, when one is wanted
	}{
		{name: "a 103 before the 101 is skipped", answer: func(int) string {
			return "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + switched
		}, status: http.StatusSwitchingProtocols, asked: 1},
		{name: "a ban ends a strict session", user: "crawler-session-ws1-strict-1", answer: func(n int) string {
			if n == 1 {
				return "HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"
			}
			return switched
		}, status: http.StatusBadGateway, reason: fault.ReasonSessionLost, asked: 1},
		{name: "a rate limit rests the member for its Retry-After", answer: func(int) string {
			return "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\nContent-Length: 2\r\n\r\nno"
		}, status: http.StatusTooManyRequests, asked: 2, restsUnder: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked atomic.Int64
			site, _ := scriptedSite(t, false, writes(&asked, tt.answer))
			e := newEnv(t, Options{AllowPrivateTargets: true, Retries: 1}, pool.StoreOptions{}, directMembers(2)...)
			rc := dialRaw(t, e.addr)
			auth := ""
			if tt.user != "" {
				auth = "Proxy-Authorization: " + basic(tt.user, "") + "\r\n"
			}
			rc.send(strings.Replace(wsHandshake("http://"+site+"/ws", site), "\r\n", "\r\n"+auth, 1))
			resp, b := rc.answer(http.MethodGet)
			if resp.StatusCode != tt.status || resp.Header.Get(HeaderReason) != tt.reason {
				t.Fatalf("got %d %q %q; want %d %q", resp.StatusCode, resp.Header.Get(HeaderReason), b, tt.status, tt.reason)
			}
			if n := asked.Load(); n != int64(tt.asked) {
				t.Fatalf("the site was asked %d times, want %d", n, tt.asked)
			}
			if tt.restsUnder == 0 {
				return
			}
			if n := restingFor(e.store, "127.0.0.1"); n != tt.asked {
				t.Fatalf("%d members rest for the site, want %d", n, tt.asked)
			}
			for _, m := range e.store.Members() {
				if until := m.Cooldowns["127.0.0.1"]; time.Until(until) > tt.restsUnder {
					t.Fatalf("%s rests for the site %v; want the site's Retry-After (5s)", m.Name, time.Until(until).Round(time.Second))
				}
			}
		})
	}
}

// TestSiteTrailersAreFilteredAsHeaders: a site's trailers pass the same
// filter as its header fields: its own X-Proxyfleet-* and hop-by-hop
// fields do not reach the client, its other trailers do, on the plain
// path and inside a MITM'd tunnel.
func TestSiteTrailersAreFilteredAsHeaders(t *testing.T) {
	const answer = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Proxyfleet-Proxy, X-Checksum, Keep-Alive\r\n\r\n" +
		"2\r\nok\r\n0\r\nX-Proxyfleet-Proxy: evil\r\nX-Checksum: abc\r\nKeep-Alive: timeout=5\r\n\r\n"
	for _, https := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "MITM"}[https], func(t *testing.T) {
			site, roots := scriptedSite(t, https, writes(nil, func(int) string { return answer }))
			ca, caRoots := newTestCA(t)
			e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: roots,
				MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{}, directMembers(1)...)
			c, u := e.client("", ""), "http://"+site+"/"
			if https {
				c, u = mitmClient(t, e.addr, caRoots, nil, nil), "https://"+site+"/"
			}
			resp, err := c.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			if b := body(t, resp); b != "ok" {
				t.Fatalf("body %q", b)
			}
			if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
				t.Fatalf("trailer X-Checksum %q, want the site's abc (trailers %v)", got, resp.Trailer)
			}
			if got := resp.Trailer.Get(HeaderProxy); got == "evil" {
				t.Fatalf("the site's trailer %s: %s reached the client", HeaderProxy, got)
			}
			if _, ok := resp.Trailer["Keep-Alive"]; ok {
				t.Fatalf("the hop-by-hop trailer Keep-Alive reached the client (trailers %v)", resp.Trailer)
			}
		})
	}
}

// TestUnaskedSwitchIsTheSitesFault: a 101 to a request that asked for no
// upgrade is refused on every path, as the lean path refuses it: 502
// target_unreachable naming it, nothing of the site's bytes after it
// relayed, and no member rests for every site.
func TestUnaskedSwitchIsTheSitesFault(t *testing.T) {
	const switched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nRAWBYTES"
	tests := []struct {
		name  string
		https bool
		proxy bool
	}{
		{name: "plain through a direct member"},
		{name: "plain through a proxy member (the lean path)", proxy: true},
		{name: "MITM'd through a proxy member", https: true, proxy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			site, roots := scriptedSite(t, tt.https, func(_ int, c net.Conn) bool {
				_, _ = io.WriteString(c, switched)
				return false
			})
			member := directMembers(1)[0]
			if tt.proxy {
				member = relayingUpstream(t, "p1")
			}
			ca, caRoots := newTestCA(t)
			e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: roots,
				MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{}, member)
			resp, b := siteExchange(t, e, tt.https, site, caRoots, func(site string) string {
				return "GET " + site + "/x HTTP/1.1\r\nHost: x\r\n\r\n"
			})
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != fault.ReasonTargetUnreachable ||
				!strings.Contains(b, "101 Switching Protocols") || strings.Contains(b, "RAWBYTES") {
				t.Fatalf("got %d %s %q; want 502 %s naming the 101", resp.StatusCode, resp.Header.Get(HeaderReason), b, fault.ReasonTargetUnreachable)
			}
			if mw := memberWide(e.store); len(mw) != 0 {
				t.Fatalf("%v rest for every site; the 101 was the site's", mw)
			}
		})
	}
}
