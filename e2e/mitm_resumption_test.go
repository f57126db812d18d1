package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/fpsite"
)

// TestMITMResumptionMirroring: curl (OpenSSL) and Node each fetch a page
// twice from a TLS site, the connection closed in between, so that the
// second fetch resumes the first's TLS session: directly (through a Squid
// tunnel) and through the mirroring gateway (a sticky session, so both
// tunnels leave through one member). The site sees the same thing both
// ways: a full handshake, then a resumption of that connection's session,
// with the same hello (JA4, JA3, fields and length: the pre-shared key and
// the padding before it included). Chromium keeps its connections alive
// and is left out.
func TestMITMResumptionMirroring(t *testing.T) {
	site := fpsite.Start(t, "127.0.0.234")
	m := startMITMSetupWith(t, "resume", []string{"127.0.0.235", "127.0.0.225"}, fpSquidAccess, site.CertPEM())
	pems := filepath.Join(t.TempDir(), "site.pem")
	writeFile(t, pems, string(site.CertPEM()))
	env := []string{"PATH=/usr/bin:/bin:" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	clients := []struct {
		name, ua string
		run      func(t *testing.T, proxy, caFile string)
	}{
		{"curl", "fp-curl", func(t *testing.T, proxy, caFile string) {
			run(t, env, "curl", "-sS", "--fail", "--http1.1", "--max-time", "30", "-A", "fp-curl", "--cacert", caFile, "-x", proxy,
				"--proxy-header", "X-Proxyfleet-Session: resume-curl", "-H", "Connection: close",
				"-o", "/dev/null", site.URL()+"/one", "-o", "/dev/null", site.URL()+"/two")
		}},
		{"node", "fp-node", func(t *testing.T, proxy, caFile string) {
			run(t, append(env, "P="+strings.TrimPrefix(proxy, "http://"), "U="+site.URL(), "NODE_EXTRA_CA_CERTS="+caFile), "node", "-e", `const http = require("http"), https = require("https"), tls = require("tls");
const [ph, pp] = process.env.P.split(":"); const u = new URL(process.env.U);
let session;
function get(path, next) {
  http.request({host: ph, port: pp, method: "CONNECT", path: u.host, headers: {"X-Proxyfleet-Session": "resume-node"}}).on("connect", (res, socket) => {
    if (res.statusCode !== 200) { console.log("CONNECT", res.statusCode); process.exit(1); }
    const s = tls.connect({socket, host: u.hostname, session});
    s.on("session", (b) => { session = b; });
    https.get({host: u.hostname, port: u.port, path, headers: {"user-agent": "fp-node", "connection": "close"},
      createConnection: () => s}, (r) => {
      r.resume(); r.on("end", () => { if (r.statusCode !== 200) process.exit(1); s.end(); setTimeout(next, 100); });
    }).on("error", (e) => { console.log("error", path, session ? "resuming" : "", e.message); process.exit(1); });
  }).end();
}
get("/one", () => get("/two", () => process.exit(0)));`)
		}},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			seen := func(from int) (first, second *fpsite.Conn, firstAt int) {
				t.Helper()
				conns := site.Conns()
				var got []*fpsite.Conn
				var at []int
				for i := from; i < len(conns); i++ {
					if clientsOn(conns[i])[c.ua] {
						got, at = append(got, conns[i]), append(at, i)
					}
				}
				if len(got) != 2 {
					t.Fatalf("the site saw %d connections of %s, want 2 (one per fetch)", len(got), c.name)
				}
				return got[0], got[1], at[0]
			}
			from := len(site.Conns())
			c.run(t, m.squids[0].URL(), pems)
			d1, d2, d1At := seen(from)
			from = len(site.Conns())
			c.run(t, "http://"+m.g.addr, m.caFile)
			g1, g2, g1At := seen(from)
			t.Logf("%s direct:  resumed %v %v  JA4 %s %s  length %d", c.name, d1.Resumed, d2.Resumed, d2.Print.JA4(), d2.Print.JA3N(), d2.Print.Length)
			t.Logf("%s mirrored: resumed %v %v  JA4 %s %s  length %d", c.name, g1.Resumed, g2.Resumed, g2.Print.JA4(), g2.Print.JA3N(), g2.Print.Length)
			if d1.Resumed || !d2.Resumed || d2.From != d1At {
				t.Fatalf("directly the second fetch did not resume the first's session (resumed %v %v, from %d): the test cannot tell", d1.Resumed, d2.Resumed, d2.From)
			}
			if g1.Resumed || !g2.Resumed || g2.From != g1At {
				t.Fatalf("through the gateway the site saw resumed %v, then %v of connection %d; want a full handshake, then a resumption of it (%d)",
					g1.Resumed, g2.Resumed, g2.From, g1At)
			}
			for _, p := range []struct{ direct, mirrored *fpsite.Conn }{{d1, g1}, {d2, g2}} {
				d, g := p.direct.Print, p.mirrored.Print
				if d.JA4() != g.JA4() || d.JA3N() != g.JA3N() || d.Shape() != g.Shape() || d.Length != g.Length {
					t.Fatalf("through the gateway the site saw\n  %s %s length %d\nwant what %s sends directly\n  %s %s length %d",
						g.JA4(), g.Shape(), g.Length, c.name, d.JA4(), d.Shape(), d.Length)
				}
			}
		})
	}
}
