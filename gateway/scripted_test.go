package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// The site and member builders of the tests that script what a site or a
// member says byte for byte.

// scriptedSite is a site on a free port of 127.0.0.1 (over TLS with a
// certificate of its own when roots is asked for) that answers each
// request it reads with answer, given the number of requests it read so
// far (1 for the first, across connections); the connection ends when
// answer returns false.
func scriptedSite(t *testing.T, withTLS bool, answer func(n int, c net.Conn) (keep bool)) (addr string, roots *x509.CertPool) {
	t.Helper()
	var n atomic.Int64
	serve := func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if !answer(int(n.Add(1)), c) {
				return
			}
		}
	}
	if !withTLS {
		return testutil.ServeTCP(t, serve), nil
	}
	cert, roots, err := testutil.SelfSignedCert(net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	return testutil.ServeTCP(t, func(c net.Conn) { serve(tls.Server(c, cfg)) }), roots
}

// writes is a scriptedSite answer that writes what answer returns for the
// n-th request and keeps the connection while writing succeeds; asked,
// when not nil, holds the number of requests read.
func writes(asked *atomic.Int64, answer func(n int) string) func(int, net.Conn) bool {
	return func(n int, c net.Conn) bool {
		if asked != nil {
			asked.Store(int64(n))
		}
		_, err := io.WriteString(c, answer(n))
		return err == nil
	}
}

// relayingUpstream is an HTTP proxy member that carries a request in
// absolute form to its host and relays the site's bytes back unread, and
// tunnels a CONNECT: what the gateway reads is the site's, byte for byte.
func relayingUpstream(t *testing.T, name string) pool.Member {
	t.Helper()
	addr := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", req.Host)
		if err != nil {
			_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
			return
		}
		defer up.Close()
		if req.Method == http.MethodConnect {
			_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		} else if err := req.Write(up); err != nil {
			return
		}
		go func() { _, _ = io.Copy(up, br) }()
		_, _ = io.Copy(c, up)
	})
	return pool.Member{Name: name, URL: &url.URL{Scheme: "http", Host: addr}}
}
