package gateway

import (
	"bufio"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

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
				site, roots := scriptedSite(t, true, writes(nil, func(int) string { return raw }))
				ca, caRoots := newTestCA(t)
				fp := FingerprintMirror
				if pathName == "MITM, Go's hello" {
					fp = FingerprintGo
				}
				o := Options{AllowPrivateTargets: true, Retries: 2, SiteRoots: roots}
				if pathName != "GET https:// in absolute form" {
					o.MITM = &MITMOptions{CA: ca, Fingerprint: fp}
				}
				e := newEnv(t, o, pool.StoreOptions{}, relayingUpstream(t, "p1"), relayingUpstream(t, "p2"), relayingUpstream(t, "p3"))
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
