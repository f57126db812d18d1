package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// scriptedTLSSite serves raw, byte for byte, as the answer to every
// request head on a TLS listener of its own; roots trust its certificate.
func scriptedTLSSite(t *testing.T, raw string) (addr string, roots *x509.CertPool) {
	t.Helper()
	cert, roots, err := testutil.SelfSignedCert(net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, raw); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), roots
}

// connectUpstream is a minimal CONNECT proxy member named name: it dials
// what it is asked for and relays both ways, and writes no answer of its
// own beyond the CONNECT's.
func connectUpstream(t *testing.T, name string) pool.Member {
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
		_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		go func() { _, _ = io.Copy(up, br) }()
		_, _ = io.Copy(c, up)
	})
	return pool.Member{Name: name, URL: &url.URL{Scheme: "http", Host: addr}}
}

// TestASitesErrorAnswerOverTLSIsNeverTheMembers pins that an answer read
// over the gateway's own TLS to the site is the site's, whatever proxy
// error header it carries: the member only relayed encrypted bytes and
// cannot have written it. Read as the member's, one request to a site
// behind a CDN answering "Proxy-Status: CDN; error=connection_limit_reached"
// rested every member for every site.
func TestASitesErrorAnswerOverTLSIsNeverTheMembers(t *testing.T) {
	answers := map[string]string{
		"a CDN's Proxy-Status":  "HTTP/1.1 503 Service Unavailable\r\nProxy-Status: ExampleCDN; error=connection_limit_reached\r\nContent-Length: 4\r\n\r\nbusy",
		"a 407 of the site's":   "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 4\r\n\r\nauth",
		"a Squid error header":  "HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\nContent-Length: 4\r\n\r\nsqd!",
		"a vendor's error code": "HTTP/1.1 502 Bad Gateway\r\nX-Brd-Err-Code: policy_20050\r\nContent-Length: 4\r\n\r\nnope",
	}
	paths := map[string]func(t *testing.T, e *env, site string, roots *x509.CertPool, caRoots *x509.CertPool) (int, string){
		"MITM, mirrored hello": mitmGet,
		"MITM, Go's hello":     mitmGet,
		"GET https:// in absolute form": func(t *testing.T, e *env, site string, _, _ *x509.CertPool) (int, string) {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, "GET https://"+site+"/ HTTP/1.1\r\nHost: "+site+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		},
	}
	for pathName, get := range paths {
		for name, raw := range answers {
			t.Run(pathName+"/"+name, func(t *testing.T) {
				site, roots := scriptedTLSSite(t, raw)
				ca, caRoots := newTestCA(t)
				fp := FingerprintMirror
				if pathName == "MITM, Go's hello" {
					fp = FingerprintGo
				}
				o := Options{AllowPrivateTargets: true, Retries: 2, SiteRoots: roots}
				if pathName != "GET https:// in absolute form" {
					o.MITM = &MITMOptions{CA: ca, Fingerprint: fp}
				}
				e := newEnv(t, o, pool.StoreOptions{}, connectUpstream(t, "p1"), connectUpstream(t, "p2"), connectUpstream(t, "p3"))
				want, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil)
				if err != nil {
					t.Fatal(err)
				}
				status, body := get(t, e, site, roots, caRoots)
				if wantBody := raw[len(raw)-4:]; status != want.StatusCode || body != wantBody {
					t.Errorf("client got %d %q, want the site's own %d %q", status, body, want.StatusCode, wantBody)
				}
				if wide := memberWide(e.store); len(wide) != 0 {
					t.Errorf("members resting for every site after the site's answer: %v", wide)
				}
			})
		}
	}
}

// mitmGet fetches https://site/ through e's MITM with a client trusting
// caRoots.
func mitmGet(t *testing.T, e *env, site string, _ *x509.CertPool, caRoots *x509.CertPool) (int, string) {
	t.Helper()
	resp, err := mitmClient(t, e.addr, caRoots, nil, nil).Get("https://" + site + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
