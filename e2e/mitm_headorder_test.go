package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/headsite"
)

// orderClient is one real client that requests a URL once, directly or
// through an HTTP proxy, trusting caFile (its SPKI hash for Chromium).
type orderClient struct {
	name string
	path string
	run  func(t *testing.T, proxy, caFile, spki, url string)
}

// orderClients are the clients of the header order test: curl (a GET with
// a control header and a hop-by-hop field of its own, and a POST with a
// body), Python requests (names in mixed case) and, over TLS only,
// headless Chromium forced to HTTP/1.1.
func orderClients(t *testing.T, withChromium bool) []orderClient {
	env := []string{"PATH=/usr/bin:/bin:" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	py := pythonWith(t, "requests")
	curl := func(extra ...string) func(t *testing.T, proxy, caFile, _, url string) {
		return func(t *testing.T, proxy, caFile, _, url string) {
			// HTTP/1.1 to the gateway too: curl offers h2 in ALPN, and the
			// MITM gateway takes it (an HTTP/2 request's field order is
			// not kept: docs/mitm.md).
			args := []string{"-sS", "-o", "/dev/null", "--fail", "--max-time", "30", "--http1.1", "-A", "order-curl"}
			if caFile != "" {
				args = append(args, "--cacert", caFile)
			}
			if proxy != "" {
				args = append(args, "-x", proxy)
			}
			run(t, env, "curl", append(append(args, extra...), url)...)
		}
	}
	cs := []orderClient{
		{"curl", "/curl", curl("-H", "X-Proxyfleet-Session: order-1", "-H", "Connection: keep-alive, X-Hop", "-H", "X-Hop: 1", "-H", "cookie: a=1")},
		{"curl-post", "/curl-post", curl("--data", "a=1&b=2", "-H", "x-lower: 1")},
		{"python-requests", "/python", func(t *testing.T, proxy, caFile, _, url string) {
			run(t, append(env, "P="+proxy, "U="+url, "CA="+caFile), py, "-c", `import os, requests
s = requests.Session()
s.trust_env = False
proxies = {"http": os.environ["P"], "https": os.environ["P"]} if os.environ["P"] else {}
verify = os.environ["CA"] or True
r = s.get(os.environ["U"], proxies=proxies, verify=verify, timeout=30,
          headers={"User-Agent": "order-python", "x-lower-case": "1", "X-Mixed-CASE": "2"})
r.raise_for_status()`)
		}},
	}
	if withChromium {
		cs = append(cs, orderClient{"chromium", "/chromium", func(t *testing.T, proxy, _, spki, url string) {
			args := []string{"--ignore-certificate-errors-spki-list=" + spki, "--disable-http2", "--disable-background-networking",
				"--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--no-pings", "--dump-dom"}
			if proxy != "" {
				args = append(args, "--proxy-server="+proxy, "--proxy-bypass-list=<-loopback>")
			}
			chromium(t, url, args...)
		}})
	}
	return cs
}

// sentOn is a request head less what a proxy does not send on (RFC 9110
// 7.6.1): the proxy's own fields (Proxy-Authorization, Proxy-Connection,
// the gateway's X-Proxyfleet-* control fields), the hop-by-hop ones and
// those Connection names, Connection itself reduced to its persistence
// options (keep-alive, close), which the next hop may be sent as the
// proxy's own. Everything else is kept byte for byte, in order.
func sentOn(head string) string {
	lines := strings.Split(strings.TrimSuffix(head, "\r\n\r\n"), "\r\n")
	drop := map[string]bool{"proxy-authorization": true, "proxy-connection": true, "keep-alive": true,
		"te": true, "trailer": true, "upgrade": true}
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Connection") {
			for _, tok := range strings.Split(v, ",") {
				drop[strings.ToLower(strings.TrimSpace(tok))] = true
			}
		}
	}
	out := []string{lines[0]}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, ":")
		lk := strings.ToLower(k)
		switch {
		case lk == "connection":
			var keep []string
			for _, tok := range strings.Split(v, ",") {
				if t := strings.TrimSpace(tok); strings.EqualFold(t, "keep-alive") || strings.EqualFold(t, "close") {
					keep = append(keep, t)
				}
			}
			if len(keep) > 0 {
				out = append(out, k+": "+strings.Join(keep, ", "))
			}
		case drop[lk] || strings.HasPrefix(lk, "x-proxyfleet-"):
		default:
			out = append(out, l)
		}
	}
	return strings.Join(out, "\r\n") + "\r\n\r\n"
}

// headFor is the one head site saw for path from index from on.
func headFor(t *testing.T, site *headsite.Site, from int, path string) string {
	t.Helper()
	var got []string
	for _, h := range site.Heads()[from:] {
		if h.Target == path || strings.HasSuffix(h.Target, "/"+strings.TrimPrefix(path, "/")) && strings.Contains(h.Target, "://") {
			got = append(got, h.Raw)
		}
	}
	if len(got) != 1 {
		t.Fatalf("the site saw %d requests for %s, want 1: %q", len(got), path, got)
	}
	return got[0]
}

// TestHeaderOrderAsTheClientWroteIt: a site of the test's own records
// each request head byte for byte. curl (a GET with the gateway's control
// header and a hop-by-hop field of its own, a POST with a body), Python
// requests and headless Chromium (HTTP/1.1 forced: the site offers only
// http/1.1, and Chromium runs with --disable-http2) each request a page
// directly and through the MITM gateway (mirror, over two real Squids):
// through the gateway the site receives the head the client sends it
// directly — request line, field order, name case and values — less what
// a proxy does not send on (sentOn). The same for plain-HTTP forwarding
// (absolute-URI requests) with curl and Python requests, through a
// gateway whose member is direct (the gateway's is the head the site
// gets), and through one whose member is an HTTP proxy: there the site of
// the test's own stands as the member and records the head the gateway
// sends it, against the head the client sends it as its proxy directly.
// (Behind a Squid member the site sees Squid's head: Squid moves Host
// after the other fields and adds its own; docs/mitm.md.)
func TestHeaderOrderAsTheClientWroteIt(t *testing.T) {
	tlsSite := headsite.Start(t, "127.0.0.163", true)
	plainSite := headsite.Start(t, "127.0.0.164", false)
	proxySite := headsite.Start(t, "127.0.0.165", false)
	m := startMITMSetupWith(t, "order", []string{"127.0.0.166", "127.0.0.167"}, fpSquidAccess, tlsSite.CertPEM())
	direct := startGateway(t, m.bin, gwConfig{})
	member := startGateway(t, m.bin, gwConfig{upstreams: []string{proxySite.URL()}})
	siteCA := filepath.Join(t.TempDir(), "site.pem")
	writeFile(t, siteCA, string(tlsSite.CertPEM()))
	siteSPKI := certSPKI(t, tlsSite.CertPEM())

	for _, tc := range []struct {
		name     string
		site     *headsite.Site // where the heads are recorded
		url      string         // the site requested
		proxy    string         // the client's proxy when "directly" (the recording member)
		gw       *gatewayProc
		chromium bool
		caDirect string
		caGW     string
	}{
		{"mitm", tlsSite, tlsSite.URL(), "", m.g, true, siteCA, m.caFile},
		{"plain-direct-member", plainSite, plainSite.URL(), "", direct, false, "", ""},
		{"plain-proxy-member", proxySite, "http://127.0.0.168:9", proxySite.URL(), member, false, "", ""},
	} {
		for _, c := range orderClients(t, tc.chromium) {
			t.Run(tc.name+"/"+c.name, func(t *testing.T) {
				url := tc.url + c.path
				from := len(tc.site.Heads())
				c.run(t, tc.proxy, tc.caDirect, siteSPKI, url)
				direct := headFor(t, tc.site, from, c.path)
				from = len(tc.site.Heads())
				c.run(t, "http://"+tc.gw.addr, tc.caGW, m.caSPKI, url)
				through := headFor(t, tc.site, from, c.path)
				t.Logf("%s directly:\n%s", c.name, direct)
				t.Logf("%s through the gateway:\n%s", c.name, through)
				if want := sentOn(direct); through != want {
					t.Fatalf("through the gateway the site received\n%q\nwant what %s sends it directly, less what a proxy does not send on\n%q",
						through, c.name, want)
				}
			})
		}
	}
}
