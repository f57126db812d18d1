package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/daemon/daemontest"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// testConfig is the Config the gateway command's defaults make, on a
// loopback port of the system's choosing, with metrics off.
func testConfig() Config {
	return Config{
		Listen:         "127.0.0.1:0",
		ReloadInterval: 2 * time.Second,
		Store: pool.StoreOptions{DefaultTTL: time.Minute, MaxTTL: time.Hour,
			Cooldown:      rotation.CooldownPolicy{Default: 10 * time.Minute, Max: time.Hour},
			FailureWindow: 30 * time.Second, SiteFailureRest: 10 * time.Second},
		Mode:             rotation.ModeSticky,
		Classifier:       rotation.Classifier{RateLimit: []int{429}, Ban: []int{403}},
		BanBodyBytes:     65536,
		Retries:          2,
		DialTimeout:      10 * time.Second,
		RequestTimeout:   60 * time.Second,
		AnswerTimeout:    15 * time.Second,
		ConnectHTTPPorts: []uint16{80},
		MaxSessions:      gateway.DefaultAffinityEntries,
		Pacing:           pacing.Options{Auto: true, MaxWait: 30 * time.Second},
		ShutdownGrace:    30 * time.Second,
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startGateway runs cfg until the usage block appears, and stops it at
// the end of the test.
func startGateway(t *testing.T, cfg Config) *daemontest.Gateway {
	t.Helper()
	return daemontest.Start(t, func(ctx context.Context, stderr io.Writer) error {
		cfg.Stderr = stderr
		return Run(ctx, cfg)
	})
}

func TestGatewayServesThroughDirectMemberAndStopsCleanly(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from target, path %s", r.URL.Path)
	}))
	defer target.Close()

	cfg := testConfig()
	cfg.APIListen, cfg.MetricsListen, cfg.AllowPrivateTargets, cfg.ShutdownGrace = "127.0.0.1:0", "127.0.0.1:0", true, 5*time.Second
	g := startGateway(t, cfg)
	out := g.Stderr.String()
	for _, want := range []string{
		"with 1 member (direct)",
		"export HTTPS_PROXY=http://" + g.Proxy + " HTTP_PROXY=http://" + g.Proxy,
		"curl -x http://" + g.Proxy + " https://example.com",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("startup message lacks %q:\n%s", want, out)
		}
	}
	if g.API == "" || g.Metrics == "" {
		t.Fatalf("startup message lacks the API or metrics address:\n%s", out)
	}

	proxyURL, _ := url.Parse("http://" + g.Proxy)
	viaProxy := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 20 * time.Second}
	code, body := daemontest.Get(t, viaProxy, target.URL+"/through")
	if code != http.StatusOK || body != "hello from target, path /through" {
		t.Fatalf("through the gateway: %d %q", code, body)
	}

	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 20 * time.Second}
	code, body = daemontest.Get(t, plain, "http://"+g.API+"/v1/proxies")
	var list struct {
		Proxies []struct {
			Name string `json:"name"`
		} `json:"proxies"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Proxies) != 1 || list.Proxies[0].Name != "direct" {
		t.Fatalf("lease API /v1/proxies = %d %q (%v), want the direct member", code, body, err)
	}

	code, body = daemontest.Get(t, plain, "http://"+g.Metrics+"/metrics")
	for _, want := range []string{
		`proxyfleet_gateway_requests_total{member="direct",outcome="ok"} 1`,
		`proxyfleet_members{healthy="true"} 1`,
		"proxyfleet_leases_active ",
		"go_goroutines ",
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if code, _ := daemontest.Get(t, plain, "http://"+g.Metrics+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d while serving, want 200", code)
	}

	if err := g.Stop(t); err != nil {
		t.Fatalf("stop returned %v, want a clean exit", err)
	}
	if _, err := net.DialTimeout("tcp", g.Proxy, time.Second); err == nil {
		t.Error("the proxy port still accepts connections after shutdown")
	}
	if !strings.Contains(g.Stderr.String(), "shutting down") {
		t.Errorf("no shutdown log line:\n%s", g.Stderr.String())
	}
}

func TestGatewayStopsCleanlyOnSIGTERM(t *testing.T) {
	g := startGateway(t, testConfig())
	// The handler is installed before the startup message, so the signal
	// reaches the gateway, not the default action.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited, err := g.Exited(30 * time.Second)
	if !exited {
		t.Fatal("gateway ignored SIGTERM for 30s")
	}
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

func TestUpstreamsFileReloadReachesTheLeaseAPI(t *testing.T) {
	file := writeFile(t, "upstreams", "# two upstreams\nhttp://127.0.0.1:1 region=eu\nhttp://127.0.0.1:2 region=us\n")
	static, err := pool.ParseUpstream("http://127.0.0.1:3")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.APIListen, cfg.Static, cfg.UpstreamsFile, cfg.ReloadInterval = "127.0.0.1:0", []pool.Member{static}, file, 50*time.Millisecond
	g := startGateway(t, cfg)
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	count := func() int {
		code, body := daemontest.Get(t, plain, "http://"+g.API+"/v1/proxies")
		var list struct {
			Count int `json:"count"`
		}
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil {
			t.Fatalf("/v1/proxies = %d %q", code, body)
		}
		return list.Count
	}
	if n := count(); n != 3 {
		t.Fatalf("%d members at start, want 3 (one static, two from the file)", n)
	}
	if !strings.Contains(g.Stderr.String(), "with 3 members") {
		t.Errorf("startup message does not count 3 members:\n%s", g.Stderr.String())
	}

	if err := os.WriteFile(file, []byte("http://127.0.0.1:1 region=eu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "2 members after the file lost a line", func() error {
		n := count()
		return poll.Check(n == 2, "%d members", n)
	}, poll.Report(g.Stderr.String))
}

func TestProbesTakeAFailingMemberOut(t *testing.T) {
	probeTarget := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer probeTarget.Close()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer site.Close()

	cfg := testConfig()
	cfg.MetricsListen, cfg.AllowPrivateTargets = "127.0.0.1:0", true
	cfg.Probe = &ProbeConfig{URL: probeTarget.URL + "/health", Interval: 100 * time.Millisecond, Timeout: 5 * time.Second,
		SuccessThreshold: 1, FailureThreshold: 1}
	g := startGateway(t, cfg)
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	poll.Until(t, 20*time.Second, "the direct member to turn unhealthy with a failing probe URL", func() error {
		_, body := daemontest.Get(t, plain, "http://"+g.Metrics+"/metrics")
		return poll.Check(strings.Contains(body, `proxyfleet_members{healthy="false"} 1`) &&
			regexp.MustCompile(`proxyfleet_probe_failures_total\{member="direct"\} [1-9]`).MatchString(body), "/metrics:\n%s", body)
	})

	proxyURL, _ := url.Parse("http://" + g.Proxy)
	viaProxy := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 20 * time.Second}
	code, body := daemontest.Get(t, viaProxy, site.URL)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "1 unhealthy") {
		t.Fatalf("through an all-unhealthy pool: %d %q, want 503 saying 1 unhealthy", code, body)
	}
}

// A busy address stops Run before anything serves, with an error naming
// the setting (its Names entry, else the field) and the address.
func TestListenFailureNamesTheSetting(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	for _, tt := range []struct {
		name  string
		names Names
		want  string
	}{
		{"no names", Names{}, "MetricsListen " + addr + ": cannot listen"},
		{"the command's names", Names{MetricsListen: "--metrics-listen"}, "--metrics-listen " + addr + ": cannot listen"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MetricsListen, cfg.Names = addr, tt.names
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
