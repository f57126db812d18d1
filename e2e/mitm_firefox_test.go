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
)

// firefoxBinary is Debian's Firefox (hack/install-deps.sh installs it).
const firefoxBinary = "firefox-esr"

// firefox loads url in headless Firefox through the HTTP proxy at proxy
// (host:port) with a fresh profile whose NSS store trusts the
// certificates of caFile as CAs, and returns once the page has loaded
// (screenshot mode), failing after two minutes.
func firefox(t *testing.T, proxy, caFile, url string) {
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
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("firefox loading %s: %v\n%s", url, err, tail(out.String(), 20))
		}
	case <-time.After(2 * time.Minute):
		// Screenshot mode exits once a page loaded, and waits on after
		// an error page.
		cancel()
		<-exited
		t.Fatalf("firefox did not load %s within 2 minutes:\n%s", url, tail(out.String(), 20))
	}
}
