package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/fpsite"
)

// fpClient is one real client that loads a URL through an HTTP proxy (a
// Squid tunnel for "direct", the gateway for MITM), trusting caFile (its
// SPKI hash for Chromium), and names itself by User-Agent.
type fpClient struct {
	name string
	ua   string
	run  func(t *testing.T, proxy, caFile, spki, url string)
}

func fpClients(t *testing.T) []fpClient {
	env := []string{"PATH=/usr/bin:/bin:" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	py := pythonWith(t, "requests")
	return []fpClient{
		{"curl", "fp-curl", func(t *testing.T, proxy, caFile, _, url string) {
			run(t, env, "curl", "-sS", "-o", "/dev/null", "--max-time", "30", "-A", "fp-curl", "--cacert", caFile, "-x", proxy, url)
		}},
		{"python-requests", "fp-python", func(t *testing.T, proxy, caFile, _, url string) {
			run(t, append(env, "P="+proxy, "U="+url, "CA="+caFile), py, "-c", `import os, requests
r = requests.get(os.environ["U"], proxies={"https": os.environ["P"]}, verify=os.environ["CA"], headers={"User-Agent": "fp-python"}, timeout=30)
r.raise_for_status()`)
		}},
		{"node", "fp-node", func(t *testing.T, proxy, caFile, _, url string) {
			run(t, append(env, "P="+strings.TrimPrefix(proxy, "http://"), "U="+url, "NODE_EXTRA_CA_CERTS="+caFile), "node", "-e", `const http = require("http"), https = require("https"), tls = require("tls");
const [ph, pp] = process.env.P.split(":"); const u = new URL(process.env.U);
http.request({host: ph, port: pp, method: "CONNECT", path: u.host}).on("connect", (res, socket) => {
  if (res.statusCode !== 200) { console.log("CONNECT", res.statusCode); process.exit(1); }
  https.get({host: u.hostname, port: u.port, path: u.pathname, headers: {"user-agent": "fp-node"},
    createConnection: () => tls.connect({socket, host: u.hostname})}, (r) => {
    r.resume(); r.on("end", () => process.exit(r.statusCode === 200 ? 0 : 1));
  }).on("error", (e) => { console.log("error", e.message); process.exit(1); });
}).end();`)
		}},
		{"aiohttp", "fp-aiohttp", func(t *testing.T, proxy, caFile, _, url string) {
			run(t, append(env, "P="+proxy, "U="+url, "CA="+caFile), pythonWith(t, "aiohttp"), "-c", `import asyncio, os, ssl, aiohttp
async def main():
    ctx = ssl.create_default_context(cafile=os.environ["CA"])
    async with aiohttp.ClientSession() as s:
        async with s.get(os.environ["U"], proxy=os.environ["P"], ssl=ctx, headers={"User-Agent": "fp-aiohttp"}) as r:
            await r.read()
            assert r.status == 200, r.status
asyncio.run(main())`)
		}},
		{"git", "git/", func(t *testing.T, proxy, caFile, _, url string) {
			// git ls-remote over libcurl-gnutls, to an (empty) repository.
			run(t, append(env, "https_proxy="+proxy, "GIT_SSL_CAINFO="+caFile, "GIT_TERMINAL_PROMPT=0"), "git", "ls-remote", url+"repo.git")
		}},
		{"wget", "fp-wget", func(t *testing.T, proxy, caFile, _, url string) {
			// GnuTLS: key shares for P-256, then x25519.
			run(t, append(env, "https_proxy="+proxy), "wget", "-q", "-O", "/dev/null", "-T", "30", "-t", "1", "-U", "fp-wget",
				"--ca-certificate="+caFile, url)
		}},
		{"java", "fp-java", func(t *testing.T, proxy, caFile, _, url string) {
			runJava(t, env, proxy, caFile, url)
		}},
		{"go", "fp-go", func(t *testing.T, proxy, caFile, _, url string) {
			getWithGo(t, proxy, caFile, url)
		}},
		{"firefox", "Firefox/", func(t *testing.T, proxy, caFile, _, url string) {
			firefox(t, strings.TrimPrefix(proxy, "http://"), caFile, url)
		}},
		{"chromium", "HeadlessChrome", func(t *testing.T, proxy, _, spki, url string) {
			// Chromium's own background requests (updates, sign-in) are
			// refused by the Squids by name (fpSquidAccess), before any
			// lookup: nothing leaves the host.
			chromium(t, url, "--proxy-server="+proxy, "--proxy-bypass-list=<-loopback>",
				"--ignore-certificate-errors-spki-list="+spki, "--disable-background-networking",
				"--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--no-pings", "--dump-dom")
		}},
	}
}

// fpSquidAccess makes the test's Squids refuse every host name (the sites
// are IP addresses) before resolving it: a browser's background requests
// stay on the host.
var fpSquidAccess = []string{"acl fp_named dstdom_regex -n [a-zA-Z]", "http_access deny fp_named"}

// fpSeen are the connections the site saw from index from on that carried
// requests of the client named ua (a browser's preconnect that carried
// nothing is left out).
func fpSeen(t *testing.T, site *fpsite.Site, from int, ua string) []*fpsite.Conn {
	t.Helper()
	var out []*fpsite.Conn
	for _, sc := range site.Conns()[from:] {
		if clientsOn(sc)[ua] {
			out = append(out, sc)
		}
	}
	if len(out) == 0 {
		t.Fatalf("the site saw no request from %s on a new connection", ua)
	}
	return out
}

// fpUAs are the clients' User-Agents (Chromium's names itself).
var fpUAs = []string{"fp-curl", "fp-python", "fp-node", "fp-aiohttp", "git/", "fp-wget", "fp-java", "fp-go", "Firefox/", "HeadlessChrome"}

// javaGet is a Java program that GETs args[1] through the proxy at
// args[0] (host:port) with Java's own HttpClient (JSSE), as a crawler on
// the JVM does: HTTP/2 where the site offers it.
const javaGet = `import java.net.*; import java.net.http.*; import java.time.Duration;
public class Get { public static void main(String[] a) throws Exception {
  String[] p = a[0].split(":");
  HttpClient c = HttpClient.newBuilder().proxy(ProxySelector.of(new InetSocketAddress(p[0], Integer.parseInt(p[1]))))
    .connectTimeout(Duration.ofSeconds(30)).build();
  HttpResponse<Void> r = c.send(HttpRequest.newBuilder(URI.create(a[1])).header("User-Agent", "fp-java")
    .timeout(Duration.ofSeconds(30)).build(), HttpResponse.BodyHandlers.discarding());
  if (r.statusCode() != 200) { System.out.println("status " + r.statusCode()); System.exit(1); }
}}`

// runJava runs javaGet with a trust store holding the certificates of
// caFile (PEM), made with keytool.
func runJava(t *testing.T, env []string, proxy, caFile, url string) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "Get.java")
	writeFile(t, src, javaGet)
	raw, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "trust.p12")
	for i := 0; ; i++ {
		var b *pem.Block
		if b, raw = pem.Decode(raw); b == nil {
			break
		}
		one := filepath.Join(dir, fmt.Sprintf("ca%d.pem", i))
		writeFile(t, one, string(pem.EncodeToMemory(b)))
		run(t, env, "keytool", "-importcert", "-noprompt", "-alias", fmt.Sprintf("ca%d", i), "-file", one,
			"-keystore", store, "-storetype", "PKCS12", "-storepass", "changeit")
	}
	run(t, env, "java", "-Djavax.net.ssl.trustStore="+store, "-Djavax.net.ssl.trustStorePassword=changeit",
		"-Djavax.net.ssl.trustStoreType=PKCS12", src, strings.TrimPrefix(proxy, "http://"), url)
}

// getWithGo GETs url with Go's own net/http client (crypto/tls, HTTP/2
// where the site offers it), as a Go crawler does, through proxy,
// trusting caFile.
func getWithGo(t *testing.T, proxy, caFile, target string) {
	t.Helper()
	raw, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(raw)
	pu, err := neturl.Parse(proxy)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", "fp-go")
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("Go's client: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Go's client got %d", resp.StatusCode)
	}
}

// clientsOn are the clients whose requests a site connection carried.
func clientsOn(sc *fpsite.Conn) map[string]bool {
	out := map[string]bool{}
	for _, r := range sc.Seen() {
		for _, ua := range fpUAs {
			if strings.Contains(r.UserAgent, ua) {
				out[ua] = true
			}
		}
	}
	return out
}

func certSPKI(t *testing.T, certPEM []byte) string {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// TestMITMFingerprintMirroring: curl, Python requests, Node, aiohttp,
// git ls-remote (libcurl-gnutls), wget (GnuTLS), Java's HttpClient (JSSE),
// Go's net/http, headless Firefox (NSS) and headless Chromium, one after
// another, load a page from a TLS site that records
// each connection's raw ClientHello and first HTTP/2 frames: directly
// (through a Squid tunnel), through the MITM gateway (mirror, the
// default) and through one started with --mitm-fingerprint go. Through
// the mirroring gateway each client opens a site connection of its own
// and the site computes the same JA4, JA3 (extensions sorted: Chromium
// shuffles them per connection), hello fields and HTTP/2 fingerprint
// (SETTINGS, WINDOW_UPDATE, PRIORITY, pseudo-header order) as directly;
// through the go gateway it computes Go's. Chromium's requests reach the
// site over HTTP/2. Afterwards no member rests for the site, none failed
// and no hello fell back to a preset. docs/mitm.md shows what this logs.
func TestMITMFingerprintMirroring(t *testing.T) {
	site := fpsite.Start(t, "127.0.0.223")
	goSite := fpsite.Start(t, "127.0.0.224")
	m := startMITMSetupWith(t, "fp", []string{"127.0.0.221", "127.0.0.222"}, fpSquidAccess, site.CertPEM(), goSite.CertPEM())
	goGW := m.startGateway(t, "--mitm-fingerprint", "go")
	pems := filepath.Join(t.TempDir(), "sites.pem")
	writeFile(t, pems, string(site.CertPEM())+string(goSite.CertPEM()))
	siteSPKI := certSPKI(t, site.CertPEM())

	for _, c := range fpClients(t) {
		t.Run(c.name, func(t *testing.T) {
			from := len(site.Conns())
			c.run(t, m.squids[0].URL(), pems, siteSPKI, site.URL()+"/")
			direct := fpSeen(t, site, from, c.ua)
			from = len(site.Conns())
			c.run(t, "http://"+m.g.addr, m.caFile, m.caSPKI, site.URL()+"/")
			mirrored := fpSeen(t, site, from, c.ua)
			c.run(t, "http://"+goGW.addr, m.caFile, m.caSPKI, goSite.URL()+"/")
			goSeen := fpSeen(t, goSite, 0, c.ua)

			d, mi, g := direct[0].Print, mirrored[0].Print, goSeen[0].Print
			t.Logf("%s direct:   JA4 %s  ALPN %s  HTTP/2 %s\n  JA3 %s", c.name, d.JA4(), direct[0].ALPN, direct[0].H2, d.JA3String())
			t.Logf("%s mirrored: JA4 %s  ALPN %s  HTTP/2 %s\n  JA3 %s", c.name, mi.JA4(), mirrored[0].ALPN, mirrored[0].H2, mi.JA3String())
			t.Logf("%s go:       JA4 %s  ALPN %s  HTTP/2 %s\n  JA3 %s", c.name, g.JA4(), goSeen[0].ALPN, goSeen[0].H2, g.JA3String())
			for _, sc := range mirrored {
				p := sc.Print
				if p.JA4() != d.JA4() || p.JA3N() != d.JA3N() || p.Shape() != d.Shape() {
					t.Fatalf("through the mirroring gateway the site saw\n  %s\n  %s\nwant what %s sends directly\n  %s\n  %s",
						p.JA4(), p.Shape(), c.name, d.JA4(), d.Shape())
				}
				if sc.ALPN != direct[0].ALPN {
					t.Fatalf("the site chose %q through the gateway, %q directly", sc.ALPN, direct[0].ALPN)
				}
				if sc.H2 != direct[0].H2 {
					t.Fatalf("through the gateway the site saw the HTTP/2 start %q, directly %q", sc.H2, direct[0].H2)
				}
			}
			if g.JA4() == d.JA4() || g.Shape() == d.Shape() {
				t.Fatalf("through the go gateway the site saw %s's own handshake (JA4 %s): the comparison cannot tell", c.name, g.JA4())
			}
			if c.name == "chromium" {
				for _, sc := range mirrored {
					if r := sc.Seen()[0]; r.Proto != "HTTP/2.0" {
						t.Fatalf("Chromium's request reached the site over %s through the gateway, want HTTP/2", r.Proto)
					}
				}
			}
		})
	}
	// One client, one site connection: the site never saw two clients'
	// requests on one connection from the mirroring gateway (or directly);
	// through the go gateway's pool it did, which shows the check can tell.
	for _, sc := range site.Conns() {
		if n := len(clientsOn(sc)); n > 1 {
			t.Fatalf("one site connection carried requests of %v", clientsOn(sc))
		}
	}
	shared := false
	for _, sc := range goSite.Conns() {
		shared = shared || len(clientsOn(sc)) > 1
	}
	if !shared {
		t.Fatal("through the go gateway no site connection carried two clients: its pool was not seen")
	}
	if strings.Contains(m.g.Output(), "cannot mirror") || strings.Contains(m.g.Output(), "failed on the gateway's side") {
		t.Fatalf("the gateway could not mirror a client:\n%s", tail(m.g.Output(), 20))
	}
	// After every client, every member is still in service for the site:
	// none rests for it, none failed, no hello fell back to a preset.
	// (Chromium's background requests to named hosts, which the Squids
	// refuse, may rest a member for those hosts.)
	siteHost := strings.Split(site.Addr(), ":")[0]
	if lines := metricLines(t, m.g.metricsAddr, "proxyfleet_site_cooldowns"); strings.Contains(strings.Join(lines, "\n"), `site="`+siteHost+`"`) {
		t.Fatalf("after all the clients a member rests for the site:\n%s", strings.Join(lines, "\n"))
	}
	for _, name := range []string{"proxyfleet_gateway_upstream_failures_total", "proxyfleet_gateway_mitm_hello_fallbacks_total"} {
		if n := counterSum(t, m.g.metricsAddr, name); n != 0 {
			t.Fatalf("after all the clients the mirroring gateway reports %s %v, want 0:\n%s", name, n, tail(m.g.Output(), 30))
		}
	}
}

// metricLines are the sample lines of a metric on the gateway's /metrics.
func metricLines(t *testing.T, metricsAddr, name string) []string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			out = append(out, line)
		}
	}
	return out
}
