package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/internal/testutil/promql"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// Screenshots of the status pages are kept as test artifacts: in
// $PROXYFLEET_ARTIFACTS when set, else in bin/artifacts of the module
// (ignored by git), so a person can look at what the test saw.
const artifactsEnv = "PROXYFLEET_ARTIFACTS"

func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(artifactsEnv)
	if dir == "" {
		root, err := testutil.ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "bin", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifacts directory %s: %v", dir, err)
	}
	return dir
}

// chromium runs headless Chromium on pageURL with args added, letting the
// page's scripts run for 8 s of virtual time (which stands still while its
// fetches are pending, so the page's first poll always lands), and returns
// what it printed.
func chromium(t *testing.T, pageURL string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath(chromiumBinary)
	if err != nil {
		t.Fatalf("%s not found (make test installs it with hack/install-deps.sh): %v", chromiumBinary, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=8000", "--window-size=1280,1600"}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, pageURL)...)
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\nstderr:\n%s", args, err, tail(stderr.String(), 40))
	}
	return stdout.String()
}

// statusPage loads pageURL in Chromium, waits for the live data, and
// returns the DOM the page's script drew; it keeps a screenshot named
// after the test in the artifacts directory.
func statusPage(t *testing.T, pageURL string) string {
	t.Helper()
	dom := chromium(t, pageURL, "--dump-dom")
	if !strings.Contains(dom, `data-state="live"`) {
		t.Fatalf("the page never showed live data from its JSON:\n%s", tail(dom, 40))
	}
	shot := filepath.Join(artifactsDir(t), strings.ReplaceAll(t.Name(), "/", "_")+".png")
	_ = os.Remove(shot)
	chromium(t, pageURL, "--screenshot="+shot, "--hide-scrollbars")
	b, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) || len(b) < 10_000 {
		t.Fatalf("screenshot %s: %d bytes, %v; want a PNG of the page", shot, len(b), err)
	}
	t.Logf("screenshot: %s", shot)
	return dom
}

// chartBars counts the SVG bars the page drew.
var chartBar = regexp.MustCompile(`<rect [^>]*class="bar"`)

// getJSON decodes the JSON at url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, b)
	}
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	code, body, err := httpGet(url)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, code, err)
	}
	return body
}

// TestGatewayStatusPageInChromium: a gateway with three real Squids (one
// banned by the site, one rate-limited) and a member that refuses
// connections (its URL carries a password) serves crawler traffic; its
// /status page, loaded in headless Chromium, shows every member, the
// cooldowns by site with why each runs, and a chart of the requests. Neither
// the page nor its JSON shows the member's password or the client token.
func TestGatewayStatusPageInChromium(t *testing.T) {
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "status", "127.0.0.121", "127.0.0.122", "127.0.0.123")
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.124"})
	site.SetRule(squids[0].OutgoingAddr(), http.StatusForbidden, nil)
	site.SetRule(squids[1].OutgoingAddr(), http.StatusTooManyRequests, map[string]string{"Retry-After": "600"})
	closed, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	const password, token = "upstream-secret-pw", "client-token-e2e-status"
	refusing := "http://crawler:" + password + "@" + closed
	g := startGateway(t, bin, gwConfig{
		upstreams: append(squidURLs(squids), refusing), rotation: "per-request", authToken: token,
		args: []string{"--cooldown", "10m", "--max-cooldown", "1h", "--failure-cooldown", "10m", "--retries", "3"},
	})
	c := g.client(t, "", nil)
	for i := range 12 {
		r, err := doGet(c, fmt.Sprintf("%s/page/%d", site.URL(), i), nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		// A ban is retried on another member while --retries allows; the
		// site serves only the third Squid.
		if r.status == http.StatusOK && r.source != squids[2].OutgoingAddr() {
			t.Fatalf("request %d: 200 from %q, which the site bans", i, r.source)
		}
	}

	jsonURL, pageURL := "http://"+g.metricsAddr+statuspage.JSONPath, "http://"+g.metricsAddr+statuspage.PagePath
	var v statuspage.GatewayView
	why := map[string]string{}
	poll.Until(t, 30*time.Second, "cooldowns of all three kinds in "+statuspage.JSONPath, func() error {
		v = statuspage.GatewayView{}
		getJSON(t, jsonURL, &v)
		for _, cd := range v.Cooldowns {
			why[cd.Member] = cd.Site + " " + cd.Reason
		}
		return poll.Check(len(why) == 3, "%v", why)
	})
	host := site.Host()
	for member, want := range map[string]string{
		squids[0].URL()[len("http://"):]: host + " banned", squids[1].URL()[len("http://"):]: host + " rate_limited",
		closed: "* upstream_failed",
	} {
		if why[member] != want {
			t.Errorf("cooldown of %s: %q, want %q (all: %v)", member, why[member], want, why)
		}
	}
	if len(v.Members) != 4 || v.Pool != "own" || v.Requests.Total < 12 {
		t.Fatalf("view: %d members, pool %q, %d requests charted; want 4, own, at least 12", len(v.Members), v.Pool, v.Requests.Total)
	}
	for _, m := range v.Members {
		if want := map[bool]string{true: statuspage.StateFailing, false: statuspage.StateOK}[m.Name == closed]; m.State != want {
			t.Errorf("member %s shows %q, want %q", m.Name, m.State, want)
		}
	}

	dom := statusPage(t, pageURL)
	for _, want := range []string{
		"<td>" + squids[2].URL() + "</td>", "<td>http://" + closed + "</td>",
		// Cooldowns by site: the site's row counts both Squids and why.
		">banned 1, rate_limited 1</td>", ">upstream_failed</td>", "<td>every site</td>", "<td>" + host + "</td>",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	if n := len(chartBar.FindAllString(dom, -1)); n == 0 {
		t.Errorf("the chart has no bars:\n%s", tail(dom, 30))
	}
	for what, text := range map[string]string{"page": dom, "page source": getBody(t, pageURL), "JSON": getBody(t, jsonURL)} {
		for _, secret := range []string{password, token} {
			if strings.Contains(text, secret) {
				t.Errorf("the %s shows the secret %q", what, secret)
			}
		}
	}
}

// metricNames are the metric names a /metrics scrape carries (histograms
// as their _bucket, _sum and _count series).
func metricNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, line := range strings.Split(getBody(t, "http://"+addr+"/metrics"), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// TestControllerStatusPageInChromium: the real controller against a real
// API server, with two External Proxies at real Squids, a ProxyPool of
// Managed Proxies on the kubernetes provider (no kubelet runs their Pods,
// so they stay Provisioning), provider checks, and a --lease-api gateway
// whose crawler traffic one Squid answers with 429. The controller's page,
// loaded in headless Chromium, shows the Proxies, the pool's desired and
// ready counts, the provider, the lease store's members and the cooldown
// by site, and a chart of lease requests; the gateway's page in --lease-api
// mode shows the lease API's members. Then every metric the chart's
// dashboard and alert rules query is checked against what the running
// controller and gateways export.
func TestControllerStatusPageInChromium(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ctx := context.Background()
	ns, podNS := env.Namespace(t), env.Namespace(t)
	squids := startSquids(t, "ctlstatus", "127.0.0.131", "127.0.0.132")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.133"})
	site.SetRule(squids[0].OutgoingAddr(), http.StatusTooManyRequests, map[string]string{"Retry-After": "600"})

	const token = "e2e-status-lease-token"
	dir := t.TempDir()
	tokenFile, providersCfg := filepath.Join(dir, "lease-api-token"), filepath.Join(dir, "providers.yaml")
	writeFile(t, tokenFile, token+"\n")
	writeFile(t, providersCfg, "providers:\n  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      namespace: "+podNS+"\n")
	ctl := startController(t, bin, env, ns, "--providers-config", providersCfg, "--lease-api-token-file", tokenFile, "--health-tick", "100ms")

	for i, sq := range squids {
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns),
			gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyAttributes(map[string]string{"squid": fmt.Sprint(i)}),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, gen.ProxyPool("eu", gen.SetProxyPoolNamespace(ns), gen.SetProxyPoolReplicas(2),
		gen.SetProxyPoolTemplate(v1alpha1.ProxySpec{Provider: "in-cluster", Attributes: map[string]string{"pool": "eu"}}))); err != nil {
		t.Fatal(err)
	}
	for i := range squids {
		waitProxy(t, env.Client, ns, fmt.Sprintf("squid-%d", i), "Ready", fleetReady)
	}

	// Crawler traffic through a --lease-api gateway: the 429 becomes a
	// cooldown of squid-0 for the site in the controller's store.
	gwPool := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolAPIArgs(t, "http://"+ctl.leaseAPIAddr, token)})
	cPool := gwPool.client(t, "", nil)
	var fv statuspage.FleetView
	poll.Until(t, pollTimeout, "a rate_limited cooldown in the controller's "+statuspage.JSONPath, func() error {
		_, _ = doGet(cPool, site.URL()+"/crawl", nil)
		fv = statuspage.FleetView{}
		getJSON(t, "http://"+ctl.statusAddr+statuspage.JSONPath, &fv)
		for _, cd := range fv.Cooldowns {
			if cd.Site == site.Host() && cd.Member == ns+"/squid-0" && cd.Reason == "rate_limited" {
				return nil
			}
		}
		return fmt.Errorf("cooldowns %+v", fv.Cooldowns)
	})
	poll.Until(t, pollTimeout, "the pool, its Provisioning Proxies and the provider in "+statuspage.JSONPath, func() error {
		fv = statuspage.FleetView{}
		getJSON(t, "http://"+ctl.statusAddr+statuspage.JSONPath, &fv)
		ok := len(fv.Pools) == 1 && fv.Pools[0].Desired == 2 && fv.Pools[0].Ready == 0 &&
			fv.Phases["Ready"] == 2 && fv.Phases["Provisioning"] == 2 && len(fv.Providers) == 1 && fv.Providers[0].Ready
		return poll.Check(ok, "pools %+v phases %v providers %+v", fv.Pools, fv.Phases, fv.Providers)
	})
	if !fv.LeaseStore || len(fv.Members) != 2 || fv.LeaseRequests.Total == 0 || fv.Namespace != ns {
		t.Fatalf("lease store %v, %d members, %d lease requests charted, namespace %q", fv.LeaseStore, len(fv.Members), fv.LeaseRequests.Total, fv.Namespace)
	}

	dom := statusPage(t, "http://"+ctl.statusAddr+statuspage.PagePath)
	for _, want := range []string{
		"<td>squid-0</td>", "<td>squid-1</td>", `>Ready</td>`, `>Provisioning</td>`, "<td>in-cluster</td>", "<td>kubernetes</td>",
		"<td>eu</td>", "<td>" + ns + "/squid-0</td>", "<td>" + site.Host() + "</td>", ">rate_limited</td>",
		"<td>" + squids[0].URL() + "</td>",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the controller's page does not show %q", want)
		}
	}
	if len(chartBar.FindAllString(dom, -1)) == 0 {
		t.Errorf("the lease requests chart has no bars:\n%s", tail(dom, 30))
	}
	if strings.Contains(dom, token) || strings.Contains(getBody(t, "http://"+ctl.statusAddr+statuspage.JSONPath), token) {
		t.Error("the controller's page shows the lease API token")
	}

	// The --lease-api gateway shows what it can see: the lease API's members
	// and cooldowns, without reasons.
	var gv statuspage.GatewayView
	getJSON(t, "http://"+gwPool.metricsAddr+statuspage.JSONPath, &gv)
	if gv.Pool != "pool-api" || len(gv.Members) != 2 || len(gv.Notes) != 1 || len(gv.Cooldowns) == 0 || gv.Cooldowns[0].Reason != "" {
		t.Errorf("--lease-api gateway view: pool %q, %d members, notes %q, cooldowns %+v", gv.Pool, len(gv.Members), gv.Notes, gv.Cooldowns)
	}

	// Two gateways with pools of their own export the gateway-side series
	// the dashboard reads: one with a member that refuses (an upstream
	// failure), one probing its member (a first failed probe takes a member
	// out at once, so this one probes a Squid: its failure counter is an
	// explicit zero).
	closed, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	gwFail := startGateway(t, bin, gwConfig{upstreams: []string{"http://" + closed, squids[1].URL()}, rotation: "per-request"})
	gwProbe := startGateway(t, bin, gwConfig{upstreams: []string{squids[1].URL()}, args: []string{"--probe-url", probe.URL() + "/probe"}})
	cFail := gwFail.client(t, "", nil)
	poll.Until(t, 30*time.Second, "an upstream failure and a probe counted", func() error {
		_, _ = doGet(cFail, site.URL()+"/own", nil)
		f, p := metricNames(t, gwFail.metricsAddr), metricNames(t, gwProbe.metricsAddr)
		return poll.Check(f["proxyfleet_gateway_upstream_failures_total"] && p["proxyfleet_probe_failures_total"],
			"upstream failures %v, probe failures %v", f["proxyfleet_gateway_upstream_failures_total"], p["proxyfleet_probe_failures_total"])
	})

	exported := map[string]bool{}
	for _, addr := range []string{ctl.metricsAddr, gwPool.metricsAddr, gwFail.metricsAddr, gwProbe.metricsAddr} {
		for n := range metricNames(t, addr) {
			exported[n] = true
		}
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	queries, err := promql.ChartQueries(root)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for where, expr := range queries {
		for _, name := range promql.MetricNames(expr) {
			checked++
			if !exported[name] {
				t.Errorf("%s queries %s, which neither the controller nor the gateways export", where, name)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d metric uses found in %d queries; the dashboard or the rules were not read", checked, len(queries))
	}
}
