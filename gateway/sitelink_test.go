//go:build !nomirror

package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	fhttp2 "github.com/bogdanfinn/fhttp/http2"
	utls "github.com/bogdanfinn/utls"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/internal/testkit/fpsite"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
	"github.com/proxyfleet/proxyfleet/pool"
)

// helloClient is an HTTP client whose TLS is uTLS with a browser preset's
// ClientHello (its ALPN list replaced by alpn unless nil; each of extra
// in place of the preset's extension of its type, or added), so the site can tell its handshake from Go's: through the
// gateway (gw set, CONNECT by hand) or directly. It speaks the protocol
// ALPN chose: HTTP/2 on one connection, or HTTP/1.1 kept alive.
func helloClient(t *testing.T, gw string, connectHeader http.Header, roots *x509.CertPool, preset string, alpn []string, extra ...utls.TLSExtension) *http.Client {
	t.Helper()
	p, err := utlsPreset(preset)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, addr string) (*utls.UConn, error) {
		var d net.Dialer
		target := addr
		if gw != "" {
			target = gw
		}
		c, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			return nil, err
		}
		if gw != "" {
			req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr, Header: connectHeader.Clone()}
			if err := req.Write(c); err != nil {
				return nil, err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), req)
			if err != nil || resp.StatusCode != 200 {
				c.Close()
				return nil, &net.OpError{Op: "connect", Err: io.ErrUnexpectedEOF}
			}
		}
		host, _, _ := net.SplitHostPort(addr)
		spec, err := utls.UTLSIdToSpec(p)
		if err != nil {
			return nil, err
		}
		spec.Extensions = withExtensions(spec.Extensions, extra)
		u := utls.UClient(c, &utls.Config{ServerName: host, RootCAs: roots}, utls.HelloCustom, false, false, true)
		if err := u.ApplyPreset(&spec); err != nil {
			return nil, err
		}
		for _, e := range u.Extensions {
			if a, ok := e.(*utls.ALPNExtension); ok && alpn != nil {
				a.AlpnProtocols = alpn
			}
		}
		if err := u.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return u, nil
	}
	rt := &helloRT{dial: dial, h1: &http.Transport{DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return dial(ctx, addr)
	}}}
	rt.h1only = len(alpn) == 1 && alpn[0] == "http/1.1"
	t.Cleanup(rt.close)
	return &http.Client{Transport: rt, Timeout: 30 * time.Second}
}

// withExtensions is exts with each of extra in place of the one of its
// type, or appended when there is none.
func withExtensions(exts, extra []utls.TLSExtension) []utls.TLSExtension {
	out := slices.Clone(exts)
	for _, e := range extra {
		i := slices.IndexFunc(out, func(o utls.TLSExtension) bool { return fmt.Sprintf("%T", o) == fmt.Sprintf("%T", e) })
		if _, generic := e.(*utls.GenericExtension); i < 0 || generic {
			out = append(out, e)
			continue
		}
		out[i] = e
	}
	return out
}

// helloRT is helloClient's RoundTripper.
type helloRT struct {
	dial   func(ctx context.Context, addr string) (*utls.UConn, error)
	h1     *http.Transport
	h1only bool
	mu     sync.Mutex
	cc     *fhttp2.ClientConn
}

func (rt *helloRT) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	if rt.h1only {
		rt.mu.Unlock()
		return rt.h1.RoundTrip(req)
	}
	if rt.cc == nil || !rt.cc.CanTakeNewRequest() {
		u, err := rt.dial(req.Context(), req.URL.Host)
		if err != nil {
			rt.mu.Unlock()
			return nil, err
		}
		if u.ConnectionState().NegotiatedProtocol != "h2" {
			// HTTP/1.1 from now on (this connection carried nothing).
			u.Close()
			rt.h1only = true
			rt.mu.Unlock()
			return rt.h1.RoundTrip(req)
		}
		if rt.cc, err = sitelink.GoH2Print.Transport().NewClientConn(u); err != nil {
			rt.mu.Unlock()
			return nil, err
		}
	}
	cc := rt.cc
	rt.mu.Unlock()
	return sitelink.H2RoundTrip(cc, req)
}

func (rt *helloRT) close() {
	rt.h1.CloseIdleConnections()
	rt.mu.Lock()
	if rt.cc != nil {
		rt.cc.Close()
	}
	rt.mu.Unlock()
}

func utlsPreset(name string) (utls.ClientHelloID, error) {
	switch name {
	case "firefox-120":
		return utls.HelloFirefox_120, nil
	case "safari-16":
		return utls.HelloSafari_16_0, nil
	}
	_, err := mirror.PresetByName(name)
	return utls.ClientHelloID{}, err
}

func getWithUA(t *testing.T, c *http.Client, u, ua string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", ua)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// fpEnv is a MITM gateway over two real Squids to one fpsite.Site.
type fpEnv struct {
	*env
	site     *fpsite.Site
	caRoots  *x509.CertPool
	bySource map[string]string
	logs     *testutil.LockedBuffer
}

func newFPEnv(t *testing.T, siteHost string, fp Fingerprint) *fpEnv {
	t.Helper()
	squids, members := squidMembers(t,
		squid.Options{Name: "fp-a", OutgoingAddr: "127.0.0.214"},
		squid.Options{Name: "fp-b", OutgoingAddr: "127.0.0.215"},
	)
	bySource := map[string]string{}
	for _, s := range squids {
		bySource[s.OutgoingAddr()] = s.Name()
	}
	site := fpsite.Start(t, siteHost)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(site.CertPEM())
	ca, caRoots := newTestCA(t)
	logs := &testutil.LockedBuffer{}
	e := newEnv(t, Options{Retries: 2, AllowPrivateTargets: true, SiteRoots: roots,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		MITM:   &MITMOptions{CA: ca, Fingerprint: fp}}, pool.StoreOptions{}, members...)
	return &fpEnv{env: e, site: site, caRoots: caRoots, bySource: bySource, logs: logs}
}

func sourceIP(remote string) string {
	h, _, _ := net.SplitHostPort(remote)
	return h
}

// TestMITMMirrorsTheClientHello: a client with Firefox's ClientHello, direct
// to the site and through the MITM gateway; the site reads both raw and
// sees the same JA3, JA4 and fields; with X-Proxyfleet-Fingerprint: go it
// sees Go's handshake (the comparison can tell).
func TestMITMMirrorsTheClientHello(t *testing.T) {
	e := newFPEnv(t, "127.0.0.216", "")
	siteRoots := x509.NewCertPool()
	siteRoots.AppendCertsFromPEM(e.site.CertPEM())

	h1 := []string{"http/1.1"}
	getWithUA(t, helloClient(t, "", nil, siteRoots, "firefox-120", h1), e.site.URL()+"/direct", "direct")
	getWithUA(t, helloClient(t, e.addr, nil, e.caRoots, "firefox-120", h1), e.site.URL()+"/mirror", "mirror")
	getWithUA(t, helloClient(t, e.addr, http.Header{HeaderFingerprint: {"go"}}, e.caRoots, "firefox-120", h1), e.site.URL()+"/go", "go")
	conns := e.site.Conns()
	if len(conns) != 3 {
		t.Fatalf("the site saw %d connections, want 3", len(conns))
	}
	direct, mirrored, goHello := conns[0].Print, conns[1].Print, conns[2].Print
	if direct.JA3String() != mirrored.JA3String() || direct.JA4() != mirrored.JA4() || direct.Shape() != mirrored.Shape() {
		t.Fatalf("through the gateway the site saw\nJA4 %s %s\nJA3 %s\nwant the client's\nJA4 %s %s\nJA3 %s",
			mirrored.JA4(), mirrored.Shape(), mirrored.JA3String(), direct.JA4(), direct.Shape(), direct.JA3String())
	}
	if goHello.JA4() == direct.JA4() || goHello.JA3String() == direct.JA3String() {
		t.Fatalf("with %s: go the site saw the client's handshake (JA4 %s)", HeaderFingerprint, goHello.JA4())
	}
	if conns[1].ALPN != "http/1.1" {
		t.Fatalf("the site negotiated %q with the gateway; the client offered http/1.1 only", conns[1].ALPN)
	}
	if _, err := mirror.Parse(append([]byte{22, 3, 1, byte(len(conns[1].Hello) >> 8), byte(len(conns[1].Hello))}, conns[1].Hello...)); err != nil {
		t.Fatalf("the gateway's own mirrored hello cannot be mirrored: %v", err)
	}
}

// TestMITMMirrorSpeaksHTTP2ToTheSite: a client speaking HTTP/2 (uTLS with
// Firefox's hello, x/net's frames) to the gateway; the site gets HTTP/2
// with the client's SETTINGS, WINDOW_UPDATE, PRIORITY and pseudo-header
// order, as it does directly. Two streams at once on the client's
// connection: a 429 on one rests that member for the site and the GET is
// retried on the other member; the other stream is served as if nothing
// happened; the tunnel's next request reuses a site connection.
func TestMITMMirrorSpeaksHTTP2ToTheSite(t *testing.T) {
	e := newFPEnv(t, "127.0.0.217", FingerprintMirror)
	siteRoots := x509.NewCertPool()
	siteRoots.AppendCertsFromPEM(e.site.CertPEM())
	getWithUA(t, helloClient(t, "", nil, siteRoots, "firefox-120", nil), e.site.URL()+"/direct", "ff")
	direct := e.site.Conns()[0]
	if direct.ALPN != "h2" || direct.H2 == "" {
		t.Fatalf("directly the site negotiated %q, HTTP/2 %q; want h2", direct.ALPN, direct.H2)
	}
	e.site.Reset()

	e.site.SetPathRule("/rl", 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "120"})
	c := helloClient(t, e.addr, nil, e.caRoots, "firefox-120", nil)
	var wg sync.WaitGroup
	answers := map[string]*http.Response{}
	var mu sync.Mutex
	for _, path := range []string{"/rl", "/other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, e.site.URL()+path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Errorf("GET %s: %v", path, err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			answers[path] = resp
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	rl, other := answers["/rl"], answers["/other"]
	if rl.StatusCode != 200 || rl.Header.Get(HeaderAttempts) != "2" || rl.ProtoMajor != 2 {
		t.Fatalf("/rl got %d over %s after %s attempts; want the retried 200 over HTTP/2 after 2", rl.StatusCode, rl.Proto, rl.Header.Get(HeaderAttempts))
	}
	if other.StatusCode != 200 || other.Header.Get(HeaderAttempts) != "1" {
		t.Fatalf("/other, on the same client connection, got %d after %s attempts; want a 200 after 1", other.StatusCode, other.Header.Get(HeaderAttempts))
	}
	if r := getWithUA(t, c, e.site.URL()+"/next", "ff"); r.StatusCode != 200 {
		t.Fatalf("/next got %d", r.StatusCode)
	}
	conns := e.site.Conns()
	if len(conns) != 2 {
		t.Fatalf("the site saw %d connections, want 2 (one per member)", len(conns))
	}
	var banned string
	for _, sc := range conns {
		if sc.ALPN != "h2" || sc.H2 != direct.H2 {
			t.Fatalf("a site connection negotiated %q with HTTP/2 frames %q; want h2 and the client's own %q", sc.ALPN, sc.H2, direct.H2)
		}
		for _, r := range sc.Seen() {
			if r.Status == 429 {
				banned = e.bySource[sourceIP(sc.Remote)]
			}
			if r.Proto != "HTTP/2.0" {
				t.Fatalf("the site got %s over %s", r.Path, r.Proto)
			}
		}
	}
	if banned == "" {
		t.Fatalf("the site never answered the 429")
	}
	for _, m := range e.store.Members() {
		_, rests := m.Cooldowns[e.site.Addr()[:strings.LastIndex(e.site.Addr(), ":")]]
		if rests != (m.Name == banned) {
			t.Fatalf("%s rests for the site: %v; want only %s, which carried the 429", m.Name, rests, banned)
		}
	}
}

// TestMITMMirrorKeepsASiteConnectionPerClient: two clients, two requests
// each, one after another: under mirror each client's requests travel on
// a site connection of their own; under go the pooled connection carries
// both clients' (which the site can see by the User-Agent).
func TestMITMMirrorKeepsASiteConnectionPerClient(t *testing.T) {
	for _, fp := range []Fingerprint{FingerprintMirror, FingerprintGo} {
		t.Run(string(fp), func(t *testing.T) {
			host := map[Fingerprint]string{FingerprintMirror: "127.0.0.218", FingerprintGo: "127.0.0.219"}[fp]
			e := newFPEnv(t, host, fp)
			a := helloClient(t, e.addr, nil, e.caRoots, "firefox-120", nil)
			b := helloClient(t, e.addr, nil, e.caRoots, "safari-16", nil)
			for i := 0; i < 2; i++ {
				getWithUA(t, a, e.site.URL()+"/a", "client-a")
				getWithUA(t, b, e.site.URL()+"/b", "client-b")
			}
			mixed := false
			var desc []string
			for _, sc := range e.site.Conns() {
				uas := map[string]int{}
				for _, r := range sc.Seen() {
					uas[r.UserAgent]++
				}
				desc = append(desc, sc.Print.JA4()+" "+strings.Join(mapKeys(uas), "+"))
				mixed = mixed || len(uas) > 1
			}
			switch {
			case fp == FingerprintMirror && (mixed || len(desc) != 2):
				t.Fatalf("under mirror the site saw %v; want two connections, one client each", desc)
			case fp == FingerprintGo && !mixed:
				t.Fatalf("under go the site saw %v; want the pooled connection to carry both clients", desc)
			}
		})
	}
}

func mapKeys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestMITMUnmirrorableHelloGetsAPreset: a ClientHello with an extension
// uTLS cannot send is still served; the site sees the fallback preset
// (Chrome's), not Go's, and the gateway says so in its log.
func TestMITMUnmirrorableHelloGetsAPreset(t *testing.T) {
	e := newFPEnv(t, "127.0.0.220", "")
	odd := &utls.GenericExtension{Id: 0x7777, Data: []byte{1, 2, 3}}
	resp := getWithUA(t, helloClient(t, e.addr, nil, e.caRoots, "firefox-120", nil, odd), e.site.URL()+"/odd", "odd")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	conns := e.site.Conns()
	if len(conns) != 1 {
		t.Fatalf("the site saw %d connections, want 1", len(conns))
	}
	p, _ := mirror.PresetByName(mirror.DefaultPreset)
	built, err := mirror.Built(mirror.Config{Host: "127.0.0.220", Preset: p, Speaks: speaksForward})
	if err != nil {
		t.Fatal(err)
	}
	want, err := tlsfp.ParseClientHello(built)
	if err != nil {
		t.Fatal(err)
	}
	if got := conns[0].Print; got.JA4() != want.JA4() {
		t.Fatalf("the site saw JA4 %s, want the %s preset's %s", got.JA4(), mirror.DefaultPreset, want.JA4())
	}
	e.rec.mu.Lock()
	unmirrorable := e.rec.fallbacks[FallbackUnmirrorable]
	e.rec.mu.Unlock()
	if unmirrorable != 1 {
		t.Fatalf("MITMHelloFallback(%s) counted %d, want 1", FallbackUnmirrorable, unmirrorable)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "cannot mirror the client's ClientHello") || !strings.Contains(logs, "preset="+mirror.DefaultPreset) ||
		!strings.Contains(logs, "30583") {
		t.Fatalf("log:\n%s\nwant a line saying the hello could not be mirrored (extension 30583), with the preset", logs)
	}
}

// TestFingerprintHeaderPerRequest: inside a mirroring tunnel a request with
// X-Proxyfleet-Fingerprint: go goes out with Go's handshake; a value that
// is neither is a 400 naming the header, on the CONNECT or inside.
func TestFingerprintHeaderPerRequest(t *testing.T) {
	e := newFPEnv(t, "127.0.0.225", "")
	c := helloClient(t, e.addr, nil, e.caRoots, "firefox-120", nil)
	getWithUA(t, c, e.site.URL()+"/mirrored", "ff")
	req, _ := http.NewRequest(http.MethodGet, e.site.URL()+"/go", nil)
	req.Header.Set(HeaderFingerprint, "go")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest(http.MethodGet, e.site.URL()+"/bad", nil)
	req.Header.Set(HeaderFingerprint, "chrome")
	bad, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(bad.Body)
	bad.Body.Close()
	if bad.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), HeaderFingerprint) {
		t.Fatalf("X-Proxyfleet-Fingerprint: chrome got %d %q, want a 400 naming the header", bad.StatusCode, body)
	}
	conns := e.site.Conns()
	if len(conns) != 2 || conns[0].Seen()[0].Path != "/mirrored" || conns[1].Seen()[0].Path != "/go" {
		t.Fatalf("the site saw %d connections, want the mirrored one, then Go's", len(conns))
	}
	if conns[0].Print.JA4() == conns[1].Print.JA4() {
		t.Fatalf("the request asking for go was sent with the mirrored handshake (JA4 %s)", conns[1].Print.JA4())
	}
	gc, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	connect := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: e.site.Addr()}, Host: e.site.Addr(),
		Header: http.Header{HeaderFingerprint: {"chrome"}}}
	if err := connect.Write(gc); err != nil {
		t.Fatal(err)
	}
	answer, err := http.ReadResponse(bufio.NewReader(gc), connect)
	if err != nil || answer.StatusCode != http.StatusBadRequest {
		t.Fatalf("CONNECT with %s: chrome got %v %v, want a 400", HeaderFingerprint, answer, err)
	}
}

// TestMITMMirrorReopensAStaleSiteConnection: the site closes the tunnel's
// idle HTTP/1.1 connection without a word; the tunnel's next GET goes out
// once more on a new site connection, and the client sees nothing of it.
func TestMITMMirrorReopensAStaleSiteConnection(t *testing.T) {
	e := newFPEnv(t, "127.0.0.221", "")
	e.site.SetIdleTimeout(100 * time.Millisecond)
	c := helloClient(t, e.addr, nil, e.caRoots, "firefox-120", []string{"http/1.1"})
	getWithUA(t, c, e.site.URL()+"/first", "ff")
	time.Sleep(500 * time.Millisecond) // the site closes the idle connection
	r := getWithUA(t, c, e.site.URL()+"/second", "ff")
	if r.StatusCode != 200 || r.Header.Get(HeaderAttempts) != "1" {
		t.Fatalf("after the site closed its idle connection the GET got %d after %s attempts, want a 200 after 1", r.StatusCode, r.Header.Get(HeaderAttempts))
	}
	conns := e.site.Conns()
	if len(conns) != 2 || conns[1].Seen()[0].Path != "/second" {
		t.Fatalf("the site saw %d connections, want 2: the closed one, then a new one for /second", len(conns))
	}
}

// TestMITMMirrorRequestTimeoutCutsTheSiteExchange pins that RequestTimeout
// bounds a MITM'd request on the tunnel's own site connection as it does a
// plain one: a site that never answers gets the client a 504 once the
// request's time is up, not once the (much longer) answer timeout is.
func TestMITMMirrorRequestTimeoutCutsTheSiteExchange(t *testing.T) {
	release := make(chan struct{})
	site := httptest.NewTLSServer(slowHandler(make(chan struct{}, 1), release))
	t.Cleanup(site.Close)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the handler
	siteRoots := x509.NewCertPool()
	siteRoots.AddCert(site.Certificate())
	ca, caRoots := newTestCA(t)
	gw := benchGatewayWith(t, Options{SiteRoots: siteRoots, RequestTimeout: 300 * time.Millisecond,
		MemberAnswerTimeout: 5 * time.Minute, MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}})
	c := mitmClient(t, gw, caRoots, nil, nil)
	// The warm-up's first exchange (the leaf, the site's handshake) may
	// itself outlast the 300 ms on a busy machine: a 504 then is the
	// timeout doing its job, and the warm-up is asked again.
	poll.Until(t, 2*time.Minute, "the warm-up through the gateway's MITM", func() error {
		a := mitmDo(t, c, http.MethodGet, site.URL+"/", nil)
		if a.status == http.StatusGatewayTimeout && a.header.Get(HeaderReason) == fault.ReasonTimeout {
			return fmt.Errorf("warm-up timed out (%d %s)", a.status, a.header.Get(HeaderReason))
		}
		if a.status != 200 || a.issuer != "proxyfleet test CA" {
			t.Fatalf("warm-up: %d from %q, want 200 through the gateway's MITM", a.status, a.issuer)
		}
		return nil
	})
	start := time.Now()
	a := mitmDo(t, c, http.MethodGet, site.URL+"/slow", nil) // the client gives up after 30 s
	if a.status != http.StatusGatewayTimeout || a.header.Get(HeaderReason) != fault.ReasonTimeout {
		t.Fatalf("a site that never answers got the client %d (%s) after %s, want 504 %s once RequestTimeout (300ms) is up",
			a.status, a.header.Get(HeaderReason), time.Since(start).Round(time.Millisecond), fault.ReasonTimeout)
	}
}

// TestMITMMirrorResumesWithTheSiteWhereTheClientResumes: Go's TLS client
// with a session cache, a new tunnel per request, through the mirroring
// gateway. The site sees a resumed session exactly when the client resumed
// its own with the gateway and the request goes through the member that
// made the session: the session the site gave a connection made for that
// same client session, once (a ticket is used once). A client that never
// resumes never makes the site see one, though the gateway holds sessions
// with the site; one resuming through the other member makes a full
// handshake there. A resumed hello is the client's, as sent directly.
// Under go a client resumes with the gateway as well.
func TestMITMMirrorResumesWithTheSiteWhereTheClientResumes(t *testing.T) {
	e := newFPEnv(t, "127.0.0.226", FingerprintMirror)
	siteRoots := x509.NewCertPool()
	siteRoots.AppendCertsFromPEM(e.site.CertPEM())
	client := func(proxy bool, cache tls.ClientSessionCache, member string) *http.Client {
		tr := &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: siteRoots, ClientSessionCache: cache, MinVersion: tls.VersionTLS12}}
		if proxy {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: e.addr})
			tr.ProxyConnectHeader = http.Header{HeaderProxy: {member}}
			tr.TLSClientConfig.RootCAs = e.caRoots
		}
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	// get fetches path and says whether the client resumed its session
	// with whoever it spoke TLS to (the gateway, or the site directly).
	get := func(c *http.Client, path string) bool {
		t.Helper()
		resp, err := c.Get(e.site.URL() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		return resp.TLS.DidResume
	}
	direct := client(false, tls.NewLRUClientSessionCache(8), "")
	a := client(true, tls.NewLRUClientSessionCache(8), "fp-a")
	never := client(true, nil, "fp-a")
	c := tls.NewLRUClientSessionCache(8)
	steps := []struct {
		c      *http.Client
		path   string
		resume bool // the client resumed with the gateway (or the site)
	}{
		{direct, "/d1", false}, {direct, "/d2", true},
		{a, "/a1", false}, {a, "/a2", true}, {a, "/a3", true},
		{never, "/n1", false}, {never, "/n2", false},
		{client(true, c, "fp-a"), "/c1", false}, {client(true, c, "fp-b"), "/c2", true},
	}
	for _, s := range steps {
		if got := get(s.c, s.path); got != s.resume {
			t.Fatalf("GET %s: the client resumed %v, want %v", s.path, got, s.resume)
		}
	}
	conns := e.site.Conns()
	at := map[string]int{}
	for i, sc := range conns {
		for _, r := range sc.Seen() {
			at[r.Path] = i
		}
	}
	if len(at) != len(steps) || len(conns) != len(steps) {
		t.Fatalf("the site saw %d connections carrying %d paths, want one each for %d", len(conns), len(at), len(steps))
	}
	const psk = 41 // pre_shared_key
	for _, w := range []struct {
		path, from string // from: the path whose connection the resumed session was issued on
	}{
		{"/d1", ""}, {"/d2", "/d1"},
		{"/a1", ""}, {"/a2", "/a1"}, {"/a3", "/a2"},
		{"/n1", ""}, {"/n2", ""},
		{"/c1", ""}, {"/c2", ""},
	} {
		sc := conns[at[w.path]]
		hasPSK := slices.Contains(sc.Print.Extensions, psk)
		switch {
		case w.from == "" && (sc.Resumed || hasPSK):
			t.Errorf("%s: the site saw a resumption (resumed %v, pre-shared key offered %v), want a full handshake", w.path, sc.Resumed, hasPSK)
		case w.from != "" && (!sc.Resumed || sc.From != at[w.from]):
			t.Errorf("%s: the site saw resumed %v of connection %d, want the session of %s's connection %d", w.path, sc.Resumed, sc.From, w.from, at[w.from])
		}
	}
	if d, m := conns[at["/d2"]].Print, conns[at["/a2"]].Print; d.JA3String() != m.JA3String() || d.JA4() != m.JA4() {
		t.Errorf("a resumed hello through the gateway: JA3 %s JA4 %s; directly JA3 %s JA4 %s", m.JA3String(), m.JA4(), d.JA3String(), d.JA4())
	}
	// The metric says the same: through the gateway the clients resumed on
	// a2, a3 and c2, the site leg on a2 and a3.
	for _, w := range []struct {
		leg     string
		resumed bool
		want    int
	}{{LegClient, true, 3}, {LegClient, false, 4}, {LegSite, true, 2}, {LegSite, false, 5}} {
		if got := e.rec.handshakesOf(w.leg, w.resumed); got != w.want {
			t.Errorf("MITMHandshake(%s, resumed %v) counted %d, want %d", w.leg, w.resumed, got, w.want)
		}
	}
	// Under go too a client resumes with the gateway on its next tunnel
	// (the site's connection is the member's pooled one either way).
	g := client(true, tls.NewLRUClientSessionCache(8), "fp-a")
	g.Transport.(*http.Transport).ProxyConnectHeader.Set(HeaderFingerprint, "go")
	if first, next := get(g, "/g1"), get(g, "/g2"); first || !next {
		t.Errorf("under go the client resumed on its first tunnel %v, on its next %v; want false, true", first, next)
	}
}

// handshakesOf is how many MITM handshakes of leg (resumed or not) the
// recorder counted.
func (r *testRecorder) handshakesOf(leg string, resumed bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.handshakes[leg+" "+strconv.FormatBool(resumed)]
}
