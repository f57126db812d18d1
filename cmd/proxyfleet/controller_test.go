//go:build !sidecar

package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/proxyfleet/proxyfleet/controller"
)

// runControllerArgs runs `proxyfleet controller args...` in-process and
// returns its error. Every case here must fail before connecting anywhere.
func runControllerArgs(t *testing.T, args ...string) error {
	t.Helper()
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	return app.Run(append([]string{"proxyfleet", "controller"}, args...))
}

func TestControllerRejectsBadFlagsNamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	badConfig := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(badConfig, []byte("providers:\n  - name: Bad_Name\n    type: kubernetes\n    kubernetes: {namespace: egress}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "zero drift poll", args: []string{"--drift-poll", "0s"}, want: "--drift-poll"},
		{name: "negative quota retry", args: []string{"--quota-retry", "-1m"}, want: "--quota-retry"},
		{name: "zero requeue-now", args: []string{"--requeue-now", "0s"}, want: "--requeue-now"},
		{name: "zero pool drain poll", args: []string{"--pool-drain-poll", "0s"}, want: "--pool-drain-poll"},
		{name: "negative autoscale interval", args: []string{"--autoscale-interval", "-1s"}, want: "--autoscale-interval"},
		{name: "zero recycle interval", args: []string{"--recycle-interval", "0s"}, want: "--recycle-interval"},
		{name: "no workers", args: []string{"--max-concurrent-reconciles", "0"}, want: "--max-concurrent-reconciles"},
		{name: "unknown log format", args: []string{"--log-format", "xml"}, want: "--log-format"},
		{name: "unknown log level", args: []string{"--log-level", "loud"}, want: "--log-level"},
		{name: "missing providers config", args: []string{"--providers-config", filepath.Join(dir, "absent.yaml")}, want: "--providers-config"},
		{name: "invalid providers config names the entry", args: []string{"--providers-config", badConfig}, want: "Bad_Name"},
		{name: "missing kubeconfig", args: []string{"--kubeconfig", filepath.Join(dir, "absent-kubeconfig")}, want: "--kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := runControllerArgs(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

func TestControllerFlagsReadTheEnvironment(t *testing.T) {
	t.Setenv("PROXYFLEET_DRIFT_POLL", "0s")
	if err := runControllerArgs(t); err == nil || !strings.Contains(err.Error(), "--drift-poll") {
		t.Fatalf("PROXYFLEET_DRIFT_POLL=0s: error = %v, want one naming --drift-poll", err)
	}
}

func TestControllerIntervalAndWorkerFlagsReachTheSettings(t *testing.T) {
	parse := parseControllerSettings
	t.Run("defaults are the production intervals and three workers", func(t *testing.T) {
		s := parse(t)
		if s.intervals != controller.DefaultIntervals() || s.maxConcurrent != 3 {
			t.Errorf("intervals %+v, workers %d; want %+v and 3", s.intervals, s.maxConcurrent, controller.DefaultIntervals())
		}
	})
	t.Run("each flag sets its own interval", func(t *testing.T) {
		s := parse(t, "--requeue-now", "11ms", "--provisioning-poll", "12ms", "--deletion-poll", "13ms",
			"--drift-poll", "14ms", "--quota-retry", "15ms", "--max-concurrent-reconciles", "7")
		want := controller.Intervals{RequeueNow: 11 * time.Millisecond, ProvisioningPoll: 12 * time.Millisecond,
			DeletionPoll: 13 * time.Millisecond, DriftPoll: 14 * time.Millisecond, QuotaRetry: 15 * time.Millisecond}
		if s.intervals != want || s.maxConcurrent != 7 {
			t.Errorf("intervals %+v, workers %d; want %+v and 7", s.intervals, s.maxConcurrent, want)
		}
	})
	t.Run("the ProxyPool periods have defaults and flags of their own", func(t *testing.T) {
		if s := parse(t); s.poolIntervals != controller.DefaultPoolIntervals() {
			t.Errorf("pool intervals %+v, want %+v", s.poolIntervals, controller.DefaultPoolIntervals())
		}
		s := parse(t, "--pool-drain-poll", "21ms", "--autoscale-interval", "22ms", "--recycle-interval", "23ms")
		if want := (controller.PoolIntervals{DrainPoll: 21 * time.Millisecond, Autoscale: 22 * time.Millisecond, Recycle: 23 * time.Millisecond}); s.poolIntervals != want {
			t.Errorf("pool intervals %+v, want %+v", s.poolIntervals, want)
		}
	})
	t.Run("the environment sets them too", func(t *testing.T) {
		t.Setenv("PROXYFLEET_QUOTA_RETRY", "2m")
		t.Setenv("PROXYFLEET_MAX_CONCURRENT_RECONCILES", "5")
		s := parse(t)
		if s.intervals.QuotaRetry != 2*time.Minute || s.maxConcurrent != 5 {
			t.Errorf("quota retry %s, workers %d; want 2m and 5", s.intervals.QuotaRetry, s.maxConcurrent)
		}
	})
}

func TestControllerNamesABadInjectionFlagBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"resources that do not parse", []string{"--sidecar-resources", "limits.memory=lots"}, "--sidecar-resources"},
		{"a certificate Secret without a namespace", []string{"--webhook-cert-secret", "just-a-name"}, "--webhook-cert-secret"},
		{"a pool API that is not a URL", []string{"--sidecar-pool-api", "ftp://x"}, "--sidecar-pool-api"},
		{"a bad listen address", []string{"--webhook-listen", "nowhere"}, "--webhook-listen"},
		{"no namespace to default the Secret to", nil, "--sidecar-pool-api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "")
			args := append([]string{"proxyfleet", "controller", "--kubeconfig", "/nonexistent/kubeconfig", "--gateway-image", "img:1",
				"--sidecar-pool-api", "http://proxyfleet.ns.svc:8090", "--webhook-cert-hosts", "127.0.0.1"}, tc.args...)
			if tc.args == nil {
				args = []string{"proxyfleet", "controller", "--kubeconfig", "/nonexistent/kubeconfig", "--gateway-image", "img:1"}
			}
			err := newApp().Run(args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("controller %v: %v, want an error naming %s", tc.args, err, tc.want)
			}
		})
	}
}

// parseControllerSettings runs only the flag parsing of `proxyfleet
// controller`, so what the reconcilers are built from can be checked
// without an API server.
func parseControllerSettings(t *testing.T, args ...string) controllerSettings {
	t.Helper()
	cmd := controllerCommand()
	var got controllerSettings
	cmd.Action = func(c *cli.Context) error {
		var err error
		got, err = parseControllerFlags(c)
		return err
	}
	app := &cli.App{Name: "proxyfleet", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard}
	if err := app.Run(append([]string{"proxyfleet", "controller"}, args...)); err != nil {
		t.Fatalf("controller %v: %v", args, err)
	}
	return got
}

func TestControllerKubeAPIRateLimitFlags(t *testing.T) {
	parse := parseControllerSettings
	cfg := &rest.Config{}
	parse(t).limitAPIRequests(cfg)
	if cfg.QPS != 50 || cfg.Burst != 100 {
		t.Errorf("default limit %v/s, burst %d; want 50/s and 100 (client-go's own 5/s made 1,000 Proxies take five minutes)", cfg.QPS, cfg.Burst)
	}
	parse(t, "--kube-api-qps", "7", "--kube-api-burst", "9").limitAPIRequests(cfg)
	if cfg.QPS != 7 || cfg.Burst != 9 {
		t.Errorf("--kube-api-qps 7 --kube-api-burst 9 gave %v/s, burst %d", cfg.QPS, cfg.Burst)
	}
	for _, flag := range []string{"--kube-api-qps", "--kube-api-burst"} {
		if err := runControllerArgs(t, flag, "0"); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s 0: error = %v, want one naming %s", flag, err, flag)
		}
	}
}

// TestControllerAPIClientHonoursRetryAfter checks, on the client the
// controller builds (its kubeconfig, its rate limit), that a 429 from the
// API server's priority and fairness is retried after the Retry-After it
// carries and not before: two refusals cost two more requests, a second
// apart, never a storm. client-go does this by itself; the test pins it.
func TestControllerAPIClientHonoursRetryAfter(t *testing.T) {
	var mu sync.Mutex
	var seen []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, time.Now())
		n := len(seen)
		mu.Unlock()
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,"message":"too many requests, please try again later"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"fleet"}}`)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "+srv.URL+"}\n"+
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	controllerSettings{kubeAPIQPS: defaultKubeAPIQPS, kubeAPIBurst: defaultKubeAPIBurst}.limitAPIRequests(cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "fleet", metav1.GetOptions{}); err != nil {
		t.Fatalf("GET after two 429s: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("%d requests for one GET answered 429 twice; want 3", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if gap := seen[i].Sub(seen[i-1]); gap < 900*time.Millisecond {
			t.Errorf("attempt %d came %s after a 429 with Retry-After: 1", i+1, gap)
		}
	}
}
