package e2e

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
var fpUAs = []string{"fp-curl", "fp-python", "fp-node", "HeadlessChrome"}

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

// TestMITMFingerprintMirroring: curl, Python requests, Node and headless
// Chromium, one after another, load a page from a TLS site that records
// each connection's raw ClientHello and first HTTP/2 frames: directly
// (through a Squid tunnel), through the MITM gateway (mirror, the
// default) and through one started with --mitm-fingerprint go. Through
// the mirroring gateway each client opens a site connection of its own
// and the site computes the same JA4, JA3 (extensions sorted: Chromium
// shuffles them per connection), hello fields and HTTP/2 fingerprint
// (SETTINGS, WINDOW_UPDATE, PRIORITY, pseudo-header order) as directly;
// through the go gateway it computes Go's. Chromium's requests reach the
// site over HTTP/2. docs/mitm.md shows what this logs.
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
	if strings.Contains(m.g.Output(), "cannot mirror") {
		t.Fatalf("the gateway could not mirror a client:\n%s", tail(m.g.Output(), 20))
	}
}
