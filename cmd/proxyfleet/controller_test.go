//go:build !sidecar

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/controller"
)

// runControllerArgs runs `proxyfleet controller args...` in-process and
// returns its error. Every case here must fail before connecting anywhere.
// The lease API may be open, as in parseControllerConfig.
func runControllerArgs(t *testing.T, args ...string) error {
	t.Helper()
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	return app.Run(append([]string{"proxyfleet", "controller", "--" + flagInsecureAllowOpen}, args...))
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
		{name: "an installation ID no backend can carry", args: []string{"--installation-id", "Prod_EU"}, want: `--installation-id: "Prod_EU" is not an installation ID`},
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
		if s.Intervals != controller.DefaultIntervals() || s.MaxConcurrentReconciles != 3 {
			t.Errorf("intervals %+v, workers %d; want %+v and 3", s.Intervals, s.MaxConcurrentReconciles, controller.DefaultIntervals())
		}
	})
	t.Run("each flag sets its own interval", func(t *testing.T) {
		s := parse(t, "--requeue-now", "11ms", "--provisioning-poll", "12ms", "--deletion-poll", "13ms",
			"--drift-poll", "14ms", "--quota-retry", "15ms", "--max-concurrent-reconciles", "7")
		want := controller.Intervals{RequeueNow: 11 * time.Millisecond, ProvisioningPoll: 12 * time.Millisecond,
			DeletionPoll: 13 * time.Millisecond, DriftPoll: 14 * time.Millisecond, QuotaRetry: 15 * time.Millisecond}
		if s.Intervals != want || s.MaxConcurrentReconciles != 7 {
			t.Errorf("intervals %+v, workers %d; want %+v and 7", s.Intervals, s.MaxConcurrentReconciles, want)
		}
	})
	t.Run("the ProxyPool periods have defaults and flags of their own", func(t *testing.T) {
		if s := parse(t); s.PoolIntervals != controller.DefaultPoolIntervals() {
			t.Errorf("pool intervals %+v, want %+v", s.PoolIntervals, controller.DefaultPoolIntervals())
		}
		s := parse(t, "--pool-drain-poll", "21ms", "--autoscale-interval", "22ms", "--recycle-interval", "23ms")
		if want := (controller.PoolIntervals{DrainPoll: 21 * time.Millisecond, Autoscale: 22 * time.Millisecond, Recycle: 23 * time.Millisecond}); s.PoolIntervals != want {
			t.Errorf("pool intervals %+v, want %+v", s.PoolIntervals, want)
		}
	})
	t.Run("the environment sets them too", func(t *testing.T) {
		t.Setenv("PROXYFLEET_QUOTA_RETRY", "2m")
		t.Setenv("PROXYFLEET_MAX_CONCURRENT_RECONCILES", "5")
		s := parse(t)
		if s.Intervals.QuotaRetry != 2*time.Minute || s.MaxConcurrentReconciles != 5 {
			t.Errorf("quota retry %s, workers %d; want 2m and 5", s.Intervals.QuotaRetry, s.MaxConcurrentReconciles)
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
		{"a pool API that is not a URL", []string{"--sidecar-lease-api", "ftp://x"}, "--sidecar-lease-api"},
		{"a bad listen address", []string{"--webhook-listen", "nowhere"}, "--webhook-listen"},
		{"a no-proxy entry that is no host, domain, IP or CIDR", []string{"--sidecar-no-proxy", "10.96.0.0/12,not a host!"}, `--sidecar-no-proxy: "not a host!"`},
		{"a cluster target in a public range", []string{"--cluster-target-cidrs", "10.244.0.0/16,198.51.100.0/24"}, `--cluster-target-cidrs: "198.51.100.0/24" is not inside a private range`},
		{"a cluster target that is no CIDR", []string{"--cluster-target-cidrs", "10.96.0.0"}, `--cluster-target-cidrs: "10.96.0.0" is not a CIDR`},
		{"no namespace to default the Secret to", nil, "--sidecar-lease-api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "")
			args := append([]string{"proxyfleet", "controller", "--kubeconfig", "/nonexistent/kubeconfig", "--gateway-image", "img:1",
				"--sidecar-lease-api", "http://proxyfleet.ns.svc:8090", "--webhook-cert-hosts", "127.0.0.1"}, tc.args...)
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
func parseControllerSettings(t *testing.T, args ...string) *controllerConfig {
	t.Helper()
	got, err := parseControllerConfig(t, args...)
	if err != nil {
		t.Fatalf("controller %v: %v", args, err)
	}
	return got
}

func TestControllerKubeAPIRateLimitFlags(t *testing.T) {
	parse := parseControllerSettings
	cfg := parse(t)
	if cfg.KubeAPIQPS != 50 || cfg.KubeAPIBurst != 100 {
		t.Errorf("default limit %v/s, burst %d; want 50/s and 100 (client-go's own 5/s made 1,000 Proxies take five minutes)", cfg.KubeAPIQPS, cfg.KubeAPIBurst)
	}
	cfg = parse(t, "--kube-api-qps", "7", "--kube-api-burst", "9")
	if cfg.KubeAPIQPS != 7 || cfg.KubeAPIBurst != 9 {
		t.Errorf("--kube-api-qps 7 --kube-api-burst 9 gave %v/s, burst %d", cfg.KubeAPIQPS, cfg.KubeAPIBurst)
	}
	for _, flag := range []string{"--kube-api-qps", "--kube-api-burst"} {
		if err := runControllerArgs(t, flag, "0"); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s 0: error = %v, want one naming %s", flag, err, flag)
		}
	}
}
