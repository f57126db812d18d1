package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// chromiumBinary is Debian's chromium; make test installs it (hack/install-deps.sh).
const chromiumBinary = "chromium"

// deadLinkPage is an HTTPS page that first asks for resources on hosts that
// do not exist (over CONNECT and plain HTTP, as a page with dead links does),
// waits until every one has failed, then fetches its data from its own
// origin and shows it. It says "loaded:" only if that last fetch worked.
const deadLinkPage = `<!doctype html>
<html><head><title>dead links</title>
<link rel="stylesheet" href="https://nx-css.invalid/site.css">
</head><body>
<img src="https://nx-img-1.invalid/a.png"><img src="http://nx-img-2.invalid/b.png">
<div id="out">waiting</div>
<script>
const dead = ["https://nx-f1.invalid/", "https://nx-f2.invalid/x", "http://nx-f3.invalid/", "https://nx-f4.invalid/"];
Promise.allSettled(dead.map(u => fetch(u, {mode: "no-cors"})))
  .then(() => fetch("/data"))
  .then(r => r.json())
  .then(a => { document.getElementById("out").textContent = "loaded:" + a.path; })
  .catch(e => { document.getElementById("out").textContent = "failed:" + e; });
</script>
</body></html>`

// TestChromiumLoadsAPageDespiteDeadHosts: headless Chromium, proxied through
// the gateway and three real Squids, loads a page whose own requests and
// Chromium's background requests go to hosts that cannot be reached. Those
// answers are about the sites, so the page's data still arrives and every
// Squid stays in service.
func TestChromiumLoadsAPageDespiteDeadHosts(t *testing.T) {
	chromium, err := exec.LookPath(chromiumBinary)
	if err != nil {
		t.Fatalf("%s not found (make test installs it with hack/install-deps.sh): %v", chromiumBinary, err)
	}
	bin := testutil.BuildBinary(t)
	trio := startSquids(t, "chromium", "127.0.0.101", "127.0.0.102", "127.0.0.103")
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio)})
	site := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.104", Pages: map[string]string{"/": deadLinkPage}})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir="+t.TempDir(),
		"--proxy-server=http://"+g.addr,
		// Chromium bypasses the proxy for loopback unless told not to.
		"--proxy-bypass-list=<-loopback>",
		// The page's certificate is the test's own, self-signed.
		"--ignore-certificate-errors",
		// Virtual time stands still while fetches are pending, so the
		// page's script runs to its end before the DOM is printed.
		"--virtual-time-budget=30000",
		"--dump-dom", site.URL()+"/")
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\nstderr:\n%s", err, tail(stderr.String(), 40))
	}
	dom := stdout.String()
	if !strings.Contains(dom, `<div id="out">loaded:/data</div>`) {
		t.Fatalf("the page did not get its data through the gateway:\n%s\nchromium stderr:\n%s\ngateway log:\n%s",
			tail(dom, 30), tail(stderr.String(), 30), tail(g.Output(), 40))
	}
	var paths []string
	for _, r := range site.Requests() {
		paths = append(paths, r.URI)
	}
	if !containsAll(paths, "/", "/data") {
		t.Fatalf("the site saw %v, want / and /data", paths)
	}
	wantInService(t, g, 3)
	outcomes := scrapeCounter(t, g.metricsAddr, "proxyfleet_gateway_requests_total", "outcome", "")
	if n := outcomes["target_unreachable"] + outcomes["dns"]; n < 1 || outcomes["upstream_failed"] != 0 {
		t.Fatalf("outcomes %v: the page's dead hosts should be counted as the sites' (target_unreachable, dns), none as a member's upstream_failed", outcomes)
	}
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
