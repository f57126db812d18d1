package gateway

import (
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// startAnsweringUpstream is an upstream proxy that always does its part: it
// reads every request it is sent, body included, and answers 200; a CONNECT
// to any host is tunnelled to site, a TLS server that answers 200. Whatever
// reaches it from the gateway is well-formed, so nothing that happens
// through it is its fault.
func startAnsweringUpstream(t testing.TB, site *httptest.Server) pool.Member {
	t.Helper()
	siteAddr := site.Listener.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			s, err := net.DialTimeout("tcp", siteAddr, 10*time.Second)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				_ = s.Close()
				return
			}
			go func() { _, _ = io.Copy(s, brw); _ = s.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(c, s)
			_ = c.Close()
			_ = s.Close()
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return pool.Member{Name: "answering", URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
}

// FuzzClientRequest sends raw client bytes to a gateway whose one member
// always answers: no input, however malformed, cut short or odd, may count
// a member failure or leave a cooldown. A client's bytes are the client's
// fault, never the member's.
func FuzzClientRequest(f *testing.F) {
	seeds := []string{
		"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nContent-Length: 5\r\n\r\nhello",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nContent-Length: 10\r\n\r\nabc",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nx\r\n0\r\n\r\n",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A: 1\r\n b\r\n\r\nGET http://127.0.0.1:9/ HTTP/1.1\r\n",
		"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n\x16\x03\x01",
		"GET https://127.0.0.1:9/ HTTP/1.1\nHost: 127.0.0.1:9\n\n",
		"GET http://1\xc2\xb77.0.0.1/ HTTP/1.1\r\nHost: 1\xc2\xb77.0.0.1\r\n\r\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	site := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "site")
	}))
	f.Cleanup(site.Close)
	member := startAnsweringUpstream(f, site)
	roots := x509.NewCertPool()
	roots.AddCert(site.Certificate())
	e := newEnv(f, Options{AllowPrivateTargets: true, Resolver: fixedResolver{}, Retries: 2, SiteRoots: roots,
		RequestTimeout: 2 * time.Second, DialTimeout: 2 * time.Second}, pool.StoreOptions{}, member)
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := net.DialTimeout("tcp", e.addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(raw); err != nil {
			return // the gateway already refused and closed
		}
		_ = c.(*net.TCPConn).CloseWrite()
		if _, err := io.Copy(io.Discard, c); err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				t.Fatalf("the gateway held a connection whose client had sent everything for 30s")
			}
		}
		if n := e.rec.failuresOf(member.Name); n != 0 {
			t.Fatalf("%d member failures counted for a client's bytes %q", n, raw)
		}
		if n := e.store.ActiveCooldowns(); n != 0 {
			t.Fatalf("%d cooldowns after a client's bytes %q: %v", n, raw, e.store.Members())
		}
		for _, m := range e.store.Members() {
			if len(m.Cooldowns) > 0 {
				t.Fatalf("member %s cooling down after a client's bytes %q", m.Name, raw)
			}
		}
	})
}
