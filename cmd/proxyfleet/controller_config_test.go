//go:build !sidecar

package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// TestEveryControllerFlagIsReadFromTheConfigFile is the gateway's every-flag
// check for `proxyfleet controller`, its part groups included.
func TestEveryControllerFlagIsReadFromTheConfigFile(t *testing.T) {
	checkEveryFlagIsReadFromTheConfigFile(t, controllerCommand())
}

// parseControllerConfig runs `proxyfleet controller args...` in-process
// with a runner that only captures the validated configuration. The lease
// API may be open (--insecure-allow-open): these cases are about other
// flags, and TestControllerLeaseAPIIsNeverOpenByAccident pins the rule.
func parseControllerConfig(t *testing.T, args ...string) (*controllerConfig, error) {
	t.Helper()
	return parseControllerConfigAsIs(t, append([]string{"--" + flagInsecureAllowOpen}, args...)...)
}

// parseControllerConfigAsIs is parseControllerConfig without the lease
// API allowed open.
func parseControllerConfigAsIs(t *testing.T, args ...string) (*controllerConfig, error) {
	t.Helper()
	var got *controllerConfig
	app := newApp()
	app.Commands = []*cli.Command{controllerCommandWith(func(_ context.Context, cfg *controllerConfig, _ io.Writer) error {
		got = cfg
		return nil
	})}
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	err := app.Run(append([]string{"proxyfleet", "controller"}, args...))
	return got, err
}

func TestControllerFlagsComeFromFlagEnvFileThenDefault(t *testing.T) {
	config := writeFile(t, "controller.yaml", `
requeue-now: 3s           # overridden by the environment
quota-retry: 4m           # overridden by the environment and then by the flag
drift-poll: 2m            # only here: the file beats the default
max-concurrent-reconciles: 9
gc-allow-namespaced: true
proxy-namespace: egress
log-format: text
`)
	t.Setenv("PROXYFLEET_REQUEUE_NOW", "4s")
	t.Setenv("PROXYFLEET_QUOTA_RETRY", "5m")
	t.Setenv("PROXYFLEET_DELETION_POLL", "6s")

	s, err := parseControllerConfig(t, "--config", config, "--quota-retry", "1m")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"quota-retry: flag beats env and file", s.Intervals.QuotaRetry, time.Minute},
		{"requeue-now: env beats file", s.Intervals.RequeueNow, 4 * time.Second},
		{"deletion-poll: env beats default", s.Intervals.DeletionPoll, 6 * time.Second},
		{"drift-poll: file beats default", s.Intervals.DriftPoll, 2 * time.Minute},
		{"provisioning-poll: default", s.Intervals.ProvisioningPoll, 10 * time.Second},
		{"max-concurrent-reconciles from a YAML number", s.MaxConcurrentReconciles, 9},
		{"proxy-namespace from the file", s.Manager.ProxyNamespace, "egress"},
		{"gc-allow-namespaced from a YAML bool", s.GC.AllowNamespaced, true},
		{"log-format from the file", s.LogJSON, false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestControllerConfigFileErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown key", "drift-poll: 1m\ndrfit-poll: 2m\n", []string{`unknown key "drfit-poll" (line 2`}},
		{"a gateway-only flag is unknown here", "upstream: [http://10.0.0.1:3128]\n", []string{`unknown key "upstream"`}},
		{"config cannot name another config", "config: other.yaml\n", []string{`unknown key "config"`}},
		{"duration without a unit", "drift-poll: 60\n", []string{`key "drift-poll" (line 1)`, "duration"}},
		{"a key given twice", "drift-poll: 1m\ndrift-poll: 2m\n", []string{`key "drift-poll" already set`, "line 2"}},
		{"integer as text", "health-workers: many\n", []string{`key "health-workers"`, "integer"}},
		{"bool as text", "leader-elect: maybe\n", []string{`key "leader-elect"`, "true or false"}},
		{"not a mapping", "- a\n- b\n", []string{"not a YAML mapping"}},
		{"a mapping where a string goes", "proxy-namespace: {name: x}\n", []string{`key "proxy-namespace"`, "want a string"}},
		{"a value the flag refuses names the flag", "max-concurrent-reconciles: 0\n", []string{"--max-concurrent-reconciles"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := writeFile(t, "controller.yaml", tt.content)
			_, err := parseControllerConfig(t, "--config", config)
			if err == nil {
				t.Fatal("config accepted, want an error")
			}
			want := tt.want
			if !strings.HasPrefix(want[0], "--") {
				want = append(want, "--config", config)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestControllerUsageErrorsNameTheFlagWithTwoDashes(t *testing.T) {
	_, err := parseControllerConfig(t, "--drift-poll", "soon")
	if err == nil || !strings.Contains(err.Error(), "--drift-poll") {
		t.Fatalf("error = %v, want one naming --drift-poll", err)
	}
}
