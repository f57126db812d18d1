package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/pool"
)

// frontTarget serves the pages the framing tests ask for through the gateway.
func frontTarget(t *testing.T) *httptest.Server {
	t.Helper()
	long := strings.Repeat("x", 10<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/short-chunked":
			// Flushed, so the target sends it chunked with no length.
			_, _ = io.WriteString(w, "short")
			w.(http.Flusher).Flush()
		case "/long-chunked":
			w.Header().Set("Trailer", "X-Sum")
			_, _ = io.WriteString(w, long)
			w.(http.Flusher).Flush()
			w.Header().Set("X-Sum", "42")
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// rawConn is one client connection to the gateway, read answer by answer.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// answer reads one answer to a request with method.
func (rc *rawConn) answer(method string) (*http.Response, string) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading the body: %v", err)
	}
	resp.Body.Close()
	return resp, string(b)
}

// closed reports whether the gateway closed the connection.
func (rc *rawConn) closed() bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := rc.br.ReadByte()
	return err == io.EOF
}

func rawGet(u, proto, extra string) string {
	host := strings.TrimPrefix(u, "http://")
	host, _, _ = strings.Cut(host, "/")
	return "GET " + u + " " + proto + "\r\nHost: " + host + "\r\n" + extra + "\r\n"
}

// TestFrontendFramesAnswersLikeNetHTTP pins the gateway's own HTTP/1.1
// server: how each answer is framed and when the connection is kept.
func TestFrontendFramesAnswersLikeNetHTTP(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := frontTarget(t)

	t.Run("an answer without a length streams chunked and the connection is kept", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/short-chunked", "HTTP/1.1", ""))
		resp, body := rc.answer("GET")
		if body != "short" || len(resp.TransferEncoding) != 1 || resp.Close {
			t.Fatalf("got %q, TE %v, close %v; want \"short\" chunked on a kept connection", body, resp.TransferEncoding, resp.Close)
		}
		if resp.Header.Get("Date") == "" {
			t.Fatal("no Date header")
		}
		rc.send(rawGet(tg.URL+"/", "HTTP/1.1", ""))
		if _, body := rc.answer("GET"); body != "ok" {
			t.Fatalf("second request on the connection: %q", body)
		}
	})
	t.Run("a long answer without a length is chunked and keeps its trailer", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/long-chunked", "HTTP/1.1", ""))
		resp, body := rc.answer("GET")
		if len(body) != 10<<10 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Fatalf("got %d bytes, TE %v; want 10 KiB chunked", len(body), resp.TransferEncoding)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "42" {
			t.Fatalf("trailer X-Sum %q, want 42", got)
		}
	})
	t.Run("HTTP/1.0 asking keep-alive is told so and kept", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/", "HTTP/1.0", "Connection: keep-alive\r\n"))
		resp, body := rc.answer("GET")
		if body != "ok" || resp.Header.Get("Connection") != "keep-alive" {
			t.Fatalf("got %q, Connection %q; want ok, keep-alive", body, resp.Header.Get("Connection"))
		}
		rc.send(rawGet(tg.URL+"/", "HTTP/1.0", ""))
		if _, body := rc.answer("GET"); body != "ok" {
			t.Fatalf("second request: %q", body)
		}
		if !rc.closed() {
			t.Fatal("HTTP/1.0 without keep-alive: connection not closed")
		}
	})
	t.Run("HTTP/1.0 long answer without a length ends with the connection", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/long-chunked", "HTTP/1.0", "Connection: keep-alive\r\n"))
		resp, body := rc.answer("GET")
		if len(body) != 10<<10 || resp.ContentLength != -1 || !resp.Close {
			t.Fatalf("got %d bytes, length %d, close %v; want 10 KiB until close", len(body), resp.ContentLength, resp.Close)
		}
	})
	t.Run("Connection: close is honoured", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/", "HTTP/1.1", "Connection: close\r\n"))
		if resp, _ := rc.answer("GET"); !resp.Close {
			t.Fatal("answer without Connection: close")
		}
		if !rc.closed() {
			t.Fatal("connection not closed")
		}
	})
	t.Run("pipelined requests are answered in order", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(rawGet(tg.URL+"/short-chunked", "HTTP/1.1", "") + rawGet(tg.URL+"/", "HTTP/1.1", ""))
		if _, body := rc.answer("GET"); body != "short" {
			t.Fatalf("first: %q", body)
		}
		if _, body := rc.answer("GET"); body != "ok" {
			t.Fatalf("second: %q", body)
		}
	})
	t.Run("HEAD gets the head only", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send(strings.Replace(rawGet(tg.URL+"/", "HTTP/1.1", ""), "GET", "HEAD", 1))
		if resp, body := rc.answer("HEAD"); resp.StatusCode != 200 || body != "" {
			t.Fatalf("HEAD: %d %q", resp.StatusCode, body)
		}
		rc.send(rawGet(tg.URL+"/", "HTTP/1.1", ""))
		if _, body := rc.answer("GET"); body != "ok" {
			t.Fatalf("after HEAD: %q", body)
		}
	})
	t.Run("the gateway's own error answer keeps the connection", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send("GET /relative HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.answer("GET")
		if resp.StatusCode != http.StatusBadRequest || resp.ContentLength != int64(len(body)) || !strings.Contains(body, "forward proxy") {
			t.Fatalf("got %d, length %d, %q", resp.StatusCode, resp.ContentLength, body)
		}
		rc.send(rawGet(tg.URL+"/", "HTTP/1.1", ""))
		if _, body := rc.answer("GET"); body != "ok" {
			t.Fatalf("after the error: %q", body)
		}
	})
	t.Run("Expect: 100-continue gets 100 Continue before the body is sent", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		host := strings.TrimPrefix(tg.URL, "http://")
		rc.send("POST " + tg.URL + "/echo HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
		line, err := rc.br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("interim answer %q (%v), want 100 Continue", line, err)
		}
		if l, _ := rc.br.ReadString('\n'); l != "\r\n" {
			t.Fatalf("100 Continue head not ended: %q", l)
		}
		rc.send("hello")
		if resp, body := rc.answer("POST"); resp.StatusCode != 200 || body != "hello" {
			t.Fatalf("got %d %q, want the body echoed", resp.StatusCode, body)
		}
	})
	t.Run("an Expect other than 100-continue is 417", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		host := strings.TrimPrefix(tg.URL, "http://")
		rc.send("POST " + tg.URL + "/echo HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\nExpect: teapot\r\n\r\nhello")
		if resp, _ := rc.answer("POST"); resp.StatusCode != http.StatusExpectationFailed {
			t.Fatalf("status %d, want 417", resp.StatusCode)
		}
	})
	t.Run("HTTP/1.1 without Host is 400", func(t *testing.T) {
		rc := dialRaw(t, e.addr)
		rc.send("GET /x HTTP/1.1\r\n\r\n")
		if resp, body := rc.answer("GET"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Host") {
			t.Fatalf("got %d %q, want 400 naming Host", resp.StatusCode, body)
		}
	})
}

// TestFrontendShutdownClosesIdleAndFinishesActive checks Shutdown as
// net/http's: an idle keep-alive connection is closed at once, a request
// in flight gets its answer (with Connection: close), then Shutdown
// returns.
func TestFrontendShutdownClosesIdleAndFinishesActive(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	slow := httptest.NewServer(slowHandler(arrived, release))
	defer slow.Close()
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)

	idle := dialRaw(t, e.addr)
	idle.send(rawGet(slow.URL+"/", "HTTP/1.1", ""))
	if _, body := idle.answer("GET"); body != "done" {
		t.Fatalf("warm-up: %q", body)
	}
	active := dialRaw(t, e.addr)
	active.send(rawGet(slow.URL+"/slow", "HTTP/1.1", ""))
	<-arrived

	shutdownDrains(t, e.gw, e.served, idle, active, release)
}

// slowHandler answers "done", to /slow only once release is closed (and
// after telling arrived).
func slowHandler(arrived chan<- struct{}, release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "done")
	})
}

// shutdownDrains shuts g down with idle (a connection between requests)
// and active (a request the target holds until release closes) open, and
// checks the drain: idle closed at once, Shutdown waiting for the request,
// whose answer ("done") then says Connection: close, and Serve returning
// http.ErrServerClosed on served.
func shutdownDrains(t *testing.T, g *Gateway, served <-chan error, idle, active *rawConn, release chan struct{}) {
	t.Helper()
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		shut <- g.Shutdown(ctx)
	}()
	if !idle.closed() {
		t.Fatal("Shutdown left an idle connection open")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	resp, body := active.answer("GET")
	if body != "done" || !resp.Close {
		t.Fatalf("in-flight request got %q, close %v; want done with Connection: close", body, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatalf("Serve returned %v, want http.ErrServerClosed", err)
	}
}

// mitmRawConn is a client's MITM'd tunnel through the gateway at addr to
// site, spoken HTTP/1.1 over TLS by hand, so a test sees when the gateway
// closes it.
func mitmRawConn(t *testing.T, addr string, site *url.URL, roots *x509.CertPool) *rawConn {
	t.Helper()
	rc := dialRaw(t, addr)
	rc.send("CONNECT " + site.Host + " HTTP/1.1\r\nHost: " + site.Host + "\r\n\r\n")
	// The answer's head only: a tunnel's bytes follow it.
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK || rc.br.Buffered() > 0 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(rc.c, &tls.Config{RootCAs: roots, ServerName: site.Hostname(), NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS with the gateway: %v", err)
	}
	if tc.ConnectionState().PeerCertificates[0].Issuer.CommonName != "proxyfleet test CA" {
		t.Fatal("the tunnel's TLS is not the gateway's (MITM off?)")
	}
	return &rawConn{t: t, c: tc, br: bufio.NewReader(tc)}
}

// TestFrontendShutdownDrainsMITMdTunnels pins that a MITM'd tunnel whose
// client speaks HTTP/1.1, served by the gateway's own loop, drains on
// Shutdown as the proxy port's connections do: an idle one is closed at
// once, a request in flight gets its answer (with Connection: close), and
// Shutdown returns only after it.
func TestFrontendShutdownDrainsMITMdTunnels(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	site := httptest.NewTLSServer(slowHandler(arrived, release))
	defer site.Close()
	siteURL, _ := url.Parse(site.URL)
	siteRoots := x509.NewCertPool()
	siteRoots.AddCert(site.Certificate())
	ca, roots := newTestCA(t)
	e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: siteRoots, MITM: &MITMOptions{CA: ca}}, pool.StoreOptions{}, directMembers(1)...)

	get := func(path string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: " + siteURL.Host + "\r\n\r\n"
	}
	idle := mitmRawConn(t, e.addr, siteURL, roots)
	idle.send(get("/"))
	if _, body := idle.answer("GET"); body != "done" {
		t.Fatalf("warm-up: %q", body)
	}
	active := mitmRawConn(t, e.addr, siteURL, roots)
	active.send(get("/slow"))
	<-arrived

	shutdownDrains(t, e.gw, e.served, idle, active, release)
}

// TestFrontendRefusesAMalformedHost pins net/http's Host check, kept by
// the gateway's own server: inside a MITM'd tunnel, where a request is in
// origin form and its Host header is what the site is sent, a Host that is
// no host is a 400 from the gateway, and nothing reaches the site. The
// reason header also says the gateway's own server answered: net/http's,
// which served these tunnels before, writes none.
func TestFrontendRefusesAMalformedHost(t *testing.T) {
	var reached atomic.Int64
	site := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	defer site.Close()
	siteURL, _ := url.Parse(site.URL)
	siteRoots := x509.NewCertPool()
	siteRoots.AddCert(site.Certificate())
	ca, roots := newTestCA(t)
	addr := benchGatewayWith(t, Options{SiteRoots: siteRoots, MITM: &MITMOptions{CA: ca}})
	for _, tc := range []struct{ name, host string }{
		{"space in the host", "exa mple.com"},
		{"path in the host", "x/y"},
		{"quote in the host", `a"b`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := mitmRawConn(t, addr, siteURL, roots)
			rc.send("GET / HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n")
			resp, body := rc.answer("GET")
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(HeaderReason) != fault.ReasonBadRequest || !strings.Contains(body, "malformed Host header") {
				t.Fatalf("Host %q: %d %q (%s), want 400 malformed Host header", tc.host, resp.StatusCode, body, resp.Header.Get(HeaderReason))
			}
		})
	}
	rc := mitmRawConn(t, addr, siteURL, roots)
	rc.send("GET / HTTP/1.1\r\nHost: " + siteURL.Host + "\r\n\r\n")
	if resp, body := rc.answer("GET"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("a well-formed Host: %d %q, want 200 ok", resp.StatusCode, body)
	}
	if n := reached.Load(); n != 1 {
		t.Fatalf("the site saw %d requests, want only the well-formed one", n)
	}
}
