package e2e

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/fpsite"
)

// firefoxBinary is Debian's Firefox (hack/install-deps.sh installs it).
const firefoxBinary = "firefox-esr"

// firefox loads url in headless Firefox through the HTTP proxy at proxy
// (host:port) with a fresh profile whose NSS store trusts the
// certificates of caFile as CAs, and returns once the page has loaded
// (screenshot mode) or done reports what the test waits for.
func firefox(t *testing.T, proxy, caFile, url string, done func() bool) {
	t.Helper()
	bin, err := exec.LookPath(firefoxBinary)
	if err != nil {
		t.Fatalf("%s not found (make test installs it with hack/install-deps.sh): %v", firefoxBinary, err)
	}
	prof := t.TempDir()
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}
	run(t, env, "certutil", "-N", "-d", "sql:"+prof, "--empty-password")
	raw, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		var b *pem.Block
		if b, raw = pem.Decode(raw); b == nil {
			break
		}
		one := filepath.Join(prof, fmt.Sprintf("ca%d.pem", i))
		writeFile(t, one, string(pem.EncodeToMemory(b)))
		run(t, env, "certutil", "-A", "-d", "sql:"+prof, "-n", fmt.Sprintf("ca%d", i), "-t", "C,,", "-i", one)
	}
	host, port, _ := strings.Cut(proxy, ":")
	// The proxy for every request (loopback included); nothing of
	// Firefox's own in the background.
	prefs := []string{
		`user_pref("network.proxy.type", 1);`,
		`user_pref("network.proxy.http", "` + host + `");`, `user_pref("network.proxy.http_port", ` + port + `);`,
		`user_pref("network.proxy.ssl", "` + host + `");`, `user_pref("network.proxy.ssl_port", ` + port + `);`,
		`user_pref("network.proxy.no_proxies_on", "");`, `user_pref("network.proxy.allow_hijacking_localhost", true);`,
		`user_pref("network.captive-portal-service.enabled", false);`, `user_pref("network.connectivity-service.enabled", false);`,
		`user_pref("app.update.enabled", false);`, `user_pref("app.normandy.enabled", false);`,
		`user_pref("datareporting.policy.dataSubmissionEnabled", false);`, `user_pref("toolkit.telemetry.enabled", false);`,
		`user_pref("browser.safebrowsing.malware.enabled", false);`, `user_pref("browser.safebrowsing.phishing.enabled", false);`,
		`user_pref("extensions.update.enabled", false);`, `user_pref("network.dns.disablePrefetch", true);`,
		`user_pref("browser.shell.checkDefaultBrowser", false);`, `user_pref("network.http.speculative-parallel-limit", 0);`,
	}
	writeFile(t, filepath.Join(prof, "user.js"), strings.Join(prefs, "\n")+"\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-remote", "--profile", prof, "--screenshot", filepath.Join(prof, "shot.png"), url)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Screenshot mode exits once a page loaded, and waits on after an
	// error page: done says when the test has what it needs.
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case <-exited:
			return
		case <-deadline:
			cancel()
			<-exited
			t.Fatalf("firefox did not load %s within 2 minutes:\n%s", url, tail(out.String(), 20))
		case <-time.After(200 * time.Millisecond):
			if done() {
				cancel()
				<-exited
				return
			}
		}
	}
}

// TestMITMFirefoxMirroring: headless Firefox (NSS), with the gateway's CA
// in its NSS store, loads a page through the MITM gateway: it is served,
// and the site read the same ClientHello (JA4, JA3, every field) and
// HTTP/2 start as from Firefox directly through a Squid tunnel; no member
// rests for the site afterwards. (Directly Firefox refuses the test
// site's certificate, a self-signed CA certificate, after its hello: the
// site has read the hello by then.)
func TestMITMFirefoxMirroring(t *testing.T) {
	site := fpsite.Start(t, "127.0.0.241")
	m := startMITMSetupWith(t, "ff", []string{"127.0.0.242", "127.0.0.243"}, fpSquidAccess, site.CertPEM())
	pems := filepath.Join(t.TempDir(), "site.pem")
	writeFile(t, pems, string(site.CertPEM()))

	firefox(t, strings.TrimPrefix(m.squids[0].URL(), "http://"), pems, site.URL()+"/", func() bool { return len(site.Conns()) > 0 })
	direct := site.Conns()
	if len(direct) == 0 {
		t.Fatal("the site saw no connection from Firefox directly")
	}
	from := len(direct)
	var mirrored []*fpsite.Conn
	served := func() bool {
		mirrored = nil
		for _, sc := range site.Conns()[from:] {
			for _, r := range sc.Seen() {
				if strings.Contains(r.UserAgent, "Firefox/") {
					mirrored = append(mirrored, sc)
					break
				}
			}
		}
		return len(mirrored) > 0
	}
	firefox(t, m.g.addr, m.caFile, site.URL()+"/", served)
	served()
	if len(mirrored) == 0 {
		t.Fatalf("Firefox's page was not served through the gateway:\n%s", tail(m.g.Output(), 30))
	}
	d := direct[0].Print
	t.Logf("firefox direct:   JA4 %s\n  JA3 %s", d.JA4(), d.JA3String())
	for _, sc := range mirrored {
		p := sc.Print
		t.Logf("firefox mirrored: JA4 %s  ALPN %s  HTTP/2 %s", p.JA4(), sc.ALPN, sc.H2)
		if p.JA4() != d.JA4() || p.JA3N() != d.JA3N() || p.Shape() != d.Shape() {
			t.Fatalf("through the gateway the site saw\n  %s\n  %s\nwant Firefox's own\n  %s\n  %s", p.JA4(), p.Shape(), d.JA4(), d.Shape())
		}
	}
	siteHost := strings.Split(site.Addr(), ":")[0]
	if lines := metricLines(t, m.g.metricsAddr, "proxyfleet_site_cooldowns"); strings.Contains(strings.Join(lines, "\n"), `site="`+siteHost+`"`) {
		t.Fatalf("after Firefox a member rests for the site:\n%s", strings.Join(lines, "\n"))
	}
	if n := counterSum(t, m.g.metricsAddr, "proxyfleet_gateway_mitm_hello_fallbacks_total"); n != 0 {
		t.Fatalf("Firefox's hello fell back to a preset %v times:\n%s", n, tail(m.g.Output(), 30))
	}
}
