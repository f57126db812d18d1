package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// A request that names no User-Agent reaches the site without one, on
// every path a request can take: the site must not see a Go-http-client
// the client never sent (it says "a Go proxy is in between"); a client's
// own User-Agent passes unchanged.
func TestARequestWithoutAUserAgentReachesTheSiteWithout(t *testing.T) {
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.121"})
	tls1 := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.122"})
	siteRoots := x509.NewCertPool()
	siteRoots.AppendCertsFromPEM(tls1.CertPEM())

	direct := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	upstream := &url.URL{Scheme: "http", Host: direct.addr}
	chained := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, pool.Member{Name: "up", URL: upstream})
	ca, caRoots := newTestCA(t)
	mitm := map[Fingerprint]*env{}
	for _, fp := range []Fingerprint{FingerprintMirror, FingerprintGo} {
		mitm[fp] = newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: siteRoots, MITM: &MITMOptions{CA: ca, Fingerprint: fp}},
			pool.StoreOptions{}, directMembers(1)...)
	}

	// plain sends a GET with no User-Agent (or ua) on a raw connection,
	// as curl -H 'User-Agent:' does, and returns what the site saw.
	plain := func(t *testing.T, gw string, ua string) http.Header {
		t.Helper()
		tg.Reset()
		c, err := net.DialTimeout("tcp", gw, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		head := "GET " + tg.URL() + "/ua HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n"
		if ua != "" {
			head += "User-Agent: " + ua + "\r\n"
		}
		if _, err := c.Write([]byte(head + "\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || len(tg.Requests()) != 1 {
			t.Fatalf("status %d, the site saw %d requests", resp.StatusCode, len(tg.Requests()))
		}
		return tg.Requests()[0].Header
	}
	// inTunnel sends it inside a MITM'd tunnel over HTTP/1.1 (Go's client
	// sends no User-Agent for an empty one).
	inTunnel := func(t *testing.T, gw string, ua string) http.Header {
		t.Helper()
		tls1.Reset()
		tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: gw}),
			TLSClientConfig: &tls.Config{RootCAs: caRoots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, tls1.URL()+"/ua", nil)
		req.Header["User-Agent"] = []string{ua}
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || len(tls1.Requests()) != 1 {
			t.Fatalf("status %d, the site saw %d requests", resp.StatusCode, len(tls1.Requests()))
		}
		return tls1.Requests()[0].Header
	}
	for _, tc := range []struct {
		name string
		send func(t *testing.T, gw string, ua string) http.Header
		gw   string
	}{
		{"plain HTTP, a direct member", plain, direct.addr},
		{"plain HTTP through an http:// upstream (the lean writer)", plain, chained.addr},
		{"MITM, mirror", inTunnel, mitm[FingerprintMirror].addr},
		{"MITM, go (pooled site connections)", inTunnel, mitm[FingerprintGo].addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if h := tc.send(t, tc.gw, ""); len(h.Values("User-Agent")) != 0 {
				t.Errorf("the client sent no User-Agent; the site saw %q", h.Values("User-Agent"))
			}
			if got := tc.send(t, tc.gw, "crawler/1.0").Values("User-Agent"); len(got) != 1 || got[0] != "crawler/1.0" {
				t.Errorf("the client's User-Agent arrived as %q", got)
			}
		})
	}
}
