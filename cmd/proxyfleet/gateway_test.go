package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/gateway/daemon/daemontest"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// runConfig runs `proxyfleet gateway args...` in-process with a runner that
// only captures the validated configuration.
func runConfig(t *testing.T, args ...string) (*gatewayConfig, error) {
	t.Helper()
	var got *gatewayConfig
	app := newApp()
	app.Commands = []*cli.Command{gatewayCommandWith(func(_ context.Context, cfg *gatewayConfig, _ io.Writer) error {
		got = cfg
		return nil
	})}
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	err := app.Run(append([]string{"proxyfleet", "gateway"}, args...))
	return got, err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGatewayDefaults(t *testing.T) {
	cfg, err := runConfig(t)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", cfg.Listen, "127.0.0.1:3128"},
		{"rotation", string(cfg.Mode), "sticky"},
		{"lease-ttl", cfg.Store.DefaultTTL, 60 * time.Second},
		{"max-lease-ttl", cfg.Store.MaxTTL, time.Hour},
		{"cooldown", cfg.Store.Cooldown.Default, 10 * time.Minute},
		{"max-cooldown", cfg.Store.Cooldown.Max, time.Hour},
		{"failure-cooldown", cfg.Store.FailureWindow, 30 * time.Second},
		{"site-failure-cooldown", cfg.Store.SiteFailureRest, 10 * time.Second},
		{"rate-limit-status", fmt.Sprint(cfg.Classifier.RateLimit), "[429]"},
		{"ban-status", fmt.Sprint(cfg.Classifier.Ban), "[403]"},
		{"retries", cfg.Retries, 2},
		{"max-leases-per-member", cfg.Store.MaxLeasesPerMember, 0},
		{"max-sessions", cfg.MaxSessions, int64(100_000)},
		{"connect-http-ports", fmt.Sprint(cfg.ConnectHTTPPorts), "[80]"},
		{"upstreams-reload-interval", cfg.ReloadInterval, 2 * time.Second},
		{"probes off", cfg.Probe == nil, true},
		{"api-listen", cfg.APIListen, ""},
		{"metrics-listen", cfg.MetricsListen, "127.0.0.1:9090"},
		{"shutdown-grace", cfg.ShutdownGrace, 30 * time.Second},
		{"dial-timeout", cfg.DialTimeout, 10 * time.Second},
		{"request-timeout", cfg.RequestTimeout, 60 * time.Second},
		{"member-answer-timeout", cfg.AnswerTimeout, 15 * time.Second},
		{"no token clients", cfg.Clients == nil, true},
		{"no static members", len(cfg.Static), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestGatewayFlagsComeFromFlagEnvFileThenDefault(t *testing.T) {
	tokens := writeFile(t, "tokens", "# crawler tokens\n\na s3cret-a all\nb s3cret-b pool=fleet/eu\n")
	config := writeFile(t, "config.yaml", `
lease-ttl: 90s            # overridden by the environment
retries: 4                # overridden by the environment and then by the flag
cooldown: 5m              # only here: the file beats the default
ban-status: [403, 451]    # a YAML list for a comma-separated flag
rate-limit-status: 429
upstream:
  - http://10.0.0.1:3128
  - socks5://10.0.0.2:1080
auth-token-file: `+tokens+`
insecure-allow-open: false
probe-url: http://example.com/
`)
	t.Setenv("PROXYFLEET_LEASE_TTL", "2m")
	t.Setenv("PROXYFLEET_RETRIES", "3")
	t.Setenv("PROXYFLEET_ROTATION", "per-request")

	cfg, err := runConfig(t, "--config", config, "--retries", "1")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"retries: flag beats env and file", cfg.Retries, 1},
		{"lease-ttl: env beats file", cfg.Store.DefaultTTL, 2 * time.Minute},
		{"rotation: env beats default", string(cfg.Mode), "request"},
		{"cooldown: file beats default", cfg.Store.Cooldown.Default, 5 * time.Minute},
		{"max-cooldown: default", cfg.Store.Cooldown.Max, time.Hour},
		{"ban-status from a YAML list", fmt.Sprint(cfg.Classifier.Ban), "[403 451]"},
		{"rate-limit-status from a YAML number", fmt.Sprint(cfg.Classifier.RateLimit), "[429]"},
		{"upstreams from a YAML list", len(cfg.Static), 2},
		{"token clients from the file named in the config", clientNames(cfg), "a,b"},
		{"probe on", cfg.Probe != nil && cfg.Probe.URL == "http://example.com/", true},
		{"probe-interval default", cfg.Probe != nil && cfg.Probe.Interval == 10*time.Second, true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestConfigFileRelativePathsResolveAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte("c tok all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("auth-token-file: tokens\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := runConfig(t, "--config", config)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Clients) != 1 || cfg.Clients[0].Token != "tok" {
		t.Fatalf("clients = %s, want c read from the file next to the config", clientNames(cfg))
	}
}

func TestConfigFileErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown key", "lease-ttl: 1m\nleese-ttl: 2m\n", []string{`unknown key "leese-ttl"`}},
		{"several unknown keys are all named", "b: 1\na: 2\n", []string{`unknown key "a", "b"`}},
		{"config cannot name another config", "config: other.yaml\n", []string{`unknown key "config"`}},
		{"duration without a unit", "lease-ttl: 60\n", []string{`key "lease-ttl"`, "duration"}},
		{"bad duration", "cooldown: soon\n", []string{`key "cooldown"`, "duration"}},
		{"integer as text", "retries: many\n", []string{`key "retries"`, "integer"}},
		{"bool as text", "insecure-allow-open: maybe\n", []string{`key "insecure-allow-open"`, "true or false"}},
		{"not a mapping", "- a\n- b\n", []string{"not a YAML mapping"}},
		{"a mapping where a string goes", "listen: {host: x}\n", []string{`key "listen"`, "want a string"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := writeFile(t, "config.yaml", tt.content)
			_, err := runConfig(t, "--config", config)
			if err == nil {
				t.Fatal("config accepted, want an error")
			}
			for _, w := range append(tt.want, "--config", config) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope.yaml")
		_, err := runConfig(t, "--config", missing)
		if err == nil || !strings.Contains(err.Error(), "--config") || !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("error = %v, want one naming --config and the missing file", err)
		}
	})
	t.Run("metrics-listen off in YAML turns metrics off", func(t *testing.T) {
		cfg, err := runConfig(t, "--config", writeFile(t, "config.yaml", "metrics-listen: off\n"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MetricsListen != "" {
			t.Fatalf("metricsListen = %q, want off", cfg.MetricsListen)
		}
	})
	t.Run("empty file is an empty config", func(t *testing.T) {
		cfg, err := runConfig(t, "--config", writeFile(t, "config.yaml", "# nothing yet\n"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Retries != 2 {
			t.Fatalf("retries = %d, want the default 2", cfg.Retries)
		}
	})
}

func TestNonLoopbackListenWithoutAuthIsRefused(t *testing.T) {
	tokens := writeFile(t, "tokens", "c tok all\n")
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"all interfaces without auth", []string{"--listen", "0.0.0.0:3128"},
			"--listen 0.0.0.0:3128 is not loopback: set --auth-token-file, or --insecure-allow-open to run an open proxy"},
		{"empty host is every interface", []string{"--listen", ":3128"},
			"--listen :3128 is not loopback: set --auth-token-file, or --insecure-allow-open to run an open proxy"},
		{"a LAN address", []string{"--listen", "192.168.1.10:3128"},
			"--listen 192.168.1.10:3128 is not loopback"},
		{"api on all interfaces without a token", []string{"--lease-api-listen", "0.0.0.0:8090"},
			"--lease-api-listen 0.0.0.0:8090 is not loopback: set --lease-api-token-file, or --insecure-allow-open to serve the lease API without a token"},
		{"all interfaces with auth", []string{"--listen", "0.0.0.0:3128", "--auth-token-file", tokens}, ""},
		{"all interfaces told to be open", []string{"--listen", "0.0.0.0:3128", "--insecure-allow-open"}, ""},
		{"a status page on all interfaces", []string{"--status-listen", ":15091"},
			"--status-listen :15091 is not loopback: the status page lists the fleet's members and cooldowns without authentication"},
		{"a status page on loopback", []string{"--status-listen", "127.0.0.1:15091"}, ""},
		{"a status page on all interfaces told to be open", []string{"--status-listen", ":15091", "--insecure-allow-open"}, ""},
		{"loopback v6 needs nothing", []string{"--listen", "[::1]:3128"}, ""},
		{"localhost needs nothing", []string{"--listen", "localhost:3128"}, ""},
		{"api with a token", []string{"--lease-api-listen", "0.0.0.0:8090", "--lease-api-token-file", tokens}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := runConfig(t, tt.args...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("started with %v, want a refusal", tt.args)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q, want %q", err, tt.wantErr)
			}
			if cfg != nil {
				t.Fatal("the runner was called despite the refusal")
			}
		})
	}
}

func TestBadFlagValuesNameTheFlag(t *testing.T) {
	empty := writeFile(t, "tokens", "# no tokens yet\n\n")
	two := writeFile(t, "tokens2", "a\nb\n")
	oldTokens := writeFile(t, "old-tokens", "# from before token clients\nold-s3cret\n")
	unknownField := writeFile(t, "unknown-field", "a s3cret region=eu\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
		deny []string
	}{
		{name: "unparsable duration", args: []string{"--lease-ttl", "soon"}, want: []string{"lease-ttl"}},
		{name: "negative duration", args: []string{"--cooldown", "-5s"}, want: []string{"--cooldown -5s: must be positive"}},
		{name: "zero duration", args: []string{"--dial-timeout", "0s"}, want: []string{"--dial-timeout 0s: must be positive"}},
		{name: "connect HTTP port that is not a number", args: []string{"--connect-http-ports", "80,http"}, want: []string{"--connect-http-ports", `"http" is not a port`}},
		{name: "cluster target that is not a CIDR", args: []string{"--cluster-target-cidrs", "10.244.0.0/16,10.96.0.0"}, want: []string{"--cluster-target-cidrs", `"10.96.0.0" is not a CIDR`}},
		{name: "cluster target in a public range", args: []string{"--cluster-target-cidrs", "203.0.113.0/24"}, want: []string{"--cluster-target-cidrs", `"203.0.113.0/24" is not inside a private range`}},
		{name: "cluster target with host bits", args: []string{"--cluster-target-cidrs", "10.244.0.1/16"}, want: []string{"--cluster-target-cidrs", "did you mean 10.244.0.0/16?"}},
		{name: "no room for a session", args: []string{"--max-sessions", "0"}, want: []string{"--max-sessions 0: must be at least 1"}},
		{name: "connect HTTP port out of range", args: []string{"--connect-http-ports", "70000"}, want: []string{"--connect-http-ports", "not a port (1-65535)"}},
		{name: "site answer timeout without a duration", args: []string{"--site-answer-timeout", "slow.example"}, want: []string{"--site-answer-timeout", "want PATTERN=DURATION"}},
		{name: "site answer timeout with a bad pattern", args: []string{"--site-answer-timeout", "a/b=3s"}, want: []string{"--site-answer-timeout", "host pattern"}},
		{name: "site answer timeout given twice", args: []string{"--site-answer-timeout", "a.example=3s", "--site-answer-timeout", "A.example.=4s"}, want: []string{"given twice"}},
		{name: "duration from the environment", env: map[string]string{"PROXYFLEET_FAILURE_COOLDOWN": "abc"}, want: []string{"failure-cooldown", "PROXYFLEET_FAILURE_COOLDOWN"}},
		{name: "negative retries", args: []string{"--retries", "-1"}, want: []string{"--retries -1: must be 0 or more"}},
		{name: "negative lease cap", args: []string{"--max-leases-per-member", "-3"}, want: []string{"--max-leases-per-member -3"}},
		{name: "bad status list", args: []string{"--rate-limit-status", "429,abc"}, want: []string{"--rate-limit-status", "abc"}},
		{name: "status out of range", args: []string{"--ban-status", "99"}, want: []string{"--ban-status", "99"}},
		{name: "unknown rotation", args: []string{"--rotation", "random"}, want: []string{"--rotation", "random"}},
		{name: "max cooldown below cooldown", args: []string{"--cooldown", "20m", "--max-cooldown", "10m"}, want: []string{"--max-cooldown 10m0s is below --cooldown 20m0s"}},
		{name: "lease ttl above its max", args: []string{"--lease-ttl", "2h"}, want: []string{"--lease-ttl 2h0m0s is above --max-lease-ttl 1h0m0s"}},
		{name: "success threshold zero", args: []string{"--probe-success-threshold", "0"}, want: []string{"--probe-success-threshold 0: must be 1 or more"}},
		{name: "failure threshold zero", args: []string{"--probe-failure-threshold", "0"}, want: []string{"--probe-failure-threshold 0: must be 1 or more"}},
		{name: "probe url not http", args: []string{"--probe-url", "ftp://x/"}, want: []string{"--probe-url"}},
		{name: "unparsable probe url never echoes its password", args: []string{"--probe-url", "http://bob:hunter2@10.0.0.1:port/"}, want: []string{"--probe-url", "bob:xxxxx@"}, deny: []string{"hunter2"}},
		{name: "bad upstream scheme never echoes its password", args: []string{"--upstream", "gopher://bob:hunter2@10.0.0.1:70"}, want: []string{"--upstream"}, deny: []string{"hunter2"}},
		{name: "unparsable upstream never echoes its password", args: []string{"--upstream", "http://bob:hunter2@10.0.0.1:port"}, want: []string{"--upstream"}, deny: []string{"hunter2"}},
		{name: "upstream without scheme never echoes its password", args: []string{"--upstream", "bob:hunter2@10.0.0.1:3128"}, want: []string{"--upstream"}, deny: []string{"hunter2"}},
		{name: "bad egress address", args: []string{"--egress-addr", "not-an-ip"}, want: []string{"--egress-addr", "not-an-ip"}},
		{name: "listen without a port", args: []string{"--listen", "127.0.0.1"}, want: []string{"--listen"}},
		{name: "metrics listen without a port", args: []string{"--metrics-listen", "localhost"}, want: []string{"--metrics-listen"}},
		{name: "empty token file", args: []string{"--auth-token-file", empty}, want: []string{"--auth-token-file", "holds no client"}},
		{name: "missing token file", args: []string{"--auth-token-file", filepath.Join(t.TempDir(), "nope")}, want: []string{"--auth-token-file", "no such file"}},
		{name: "a token line without a client name", args: []string{"--auth-token-file", oldTokens}, want: []string{"--auth-token-file", "line 2: a token without a client name", "NAME TOKEN all"}, deny: []string{"old-s3cret"}},
		{name: "a token client with an unknown field", args: []string{"--auth-token-file", unknownField}, want: []string{"--auth-token-file", "line 1 (client a): unknown field region="}, deny: []string{"s3cret"}},
		{name: "api token file with two tokens", args: []string{"--lease-api-token-file", two}, want: []string{"--lease-api-token-file", "exactly one"}, deny: []string{"\na\n"}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"--log-level"}},
		{name: "bad log format", args: []string{"--log-format", "xml"}, want: []string{"--log-format"}},
		{name: "stray argument", args: []string{"0.0.0.0:3128"}, want: []string{"no arguments"}},
		{name: "unknown flag", args: []string{"--lisen", "x"}, want: []string{"lisen"}},
		{name: "lease store with an unknown scheme never echoes its password", args: []string{"--lease-store", "mongo://u:hunter2@h:1"}, want: []string{"--lease-store", "unknown scheme"}, deny: []string{"hunter2"}},
		{name: "lease store without a port never echoes its password", args: []string{"--lease-store", "redis://:hunter2@h/0"}, want: []string{"--lease-store", "host:port"}, deny: []string{"hunter2"}},
		{name: "lease store prefix with a brace", args: []string{"--lease-store", "redis://127.0.0.1:1", "--lease-store-prefix", "a{b"}, want: []string{"--lease-store-prefix"}},
		{name: "lease store prefix for the memory store", args: []string{"--lease-store-prefix", "x"}, want: []string{"--lease-store-prefix needs a Redis --lease-store"}},
		{name: "lease store shards out of range", args: []string{"--lease-store", "redis://127.0.0.1:1", "--lease-store-shards", "0"}, want: []string{"--lease-store-shards 0", "1 to 64"}},
		{name: "lease store shards for the memory store", args: []string{"--lease-store-shards", "3"}, want: []string{"--lease-store-shards needs a Redis --lease-store"}},
		{name: "lease store CA file with a plaintext URL never echoes its password", args: []string{"--lease-store", "redis://:hunter2@127.0.0.1:1", "--lease-store-ca-file", empty}, want: []string{"--lease-store-ca-file needs a TLS --lease-store", "plaintext"}, deny: []string{"hunter2"}},
		{name: "lease store client certificate without its key", args: []string{"--lease-store", "rediss://127.0.0.1:1", "--lease-store-cert-file", empty}, want: []string{"--lease-store-cert-file and --lease-store-key-file go together"}},
		{name: "lease store CA file for the memory store", args: []string{"--lease-store-ca-file", empty}, want: []string{"--lease-store-ca-file needs a Redis --lease-store"}},
		{name: "lease store password file missing", args: []string{"--lease-store", "redis://127.0.0.1:1", "--lease-store-password-file", filepath.Join(t.TempDir(), "nope")}, want: []string{"--lease-store-password-file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, err := runConfig(t, tt.args...)
			if err == nil {
				t.Fatalf("accepted %v, want an error", tt.args)
			}
			if cfg != nil {
				t.Fatal("the runner was called despite the error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, d := range tt.deny {
				if strings.Contains(err.Error(), d) {
					t.Errorf("error %q leaks %q", err, d)
				}
			}
		})
	}
}

func TestEveryGatewayFlagHasItsEnvVar(t *testing.T) {
	for _, f := range gatewayFlags() {
		name := f.Names()[0]
		env := f.(cli.DocGenerationFlag).GetEnvVars()
		want := []string{"PROXYFLEET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
		if old, ok := formerNames[name]; ok {
			want = append(want, "PROXYFLEET_"+strings.ToUpper(strings.ReplaceAll(old, "-", "_")))
		}
		if strings.Join(env, " ") != strings.Join(want, " ") {
			t.Errorf("--%s reads %v, want %v", name, env, want)
		}
	}
}

// TestRenamedFlagsKeepTheirFormerNames: a flag renamed so that the lease
// API has one name still takes its former name for one release, on the
// command line, as the environment variable and as a --config key, and
// --help lists both.
func TestRenamedFlagsKeepTheirFormerNames(t *testing.T) {
	tokens := writeFile(t, "api-token", "api-s3cret\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want func(*gatewayConfig) bool
	}{
		{"--api-listen on the command line", []string{"--api-listen", "127.0.0.1:18090"}, nil,
			func(c *gatewayConfig) bool { return c.APIListen == "127.0.0.1:18090" }},
		{"PROXYFLEET_API_LISTEN", nil, map[string]string{"PROXYFLEET_API_LISTEN": "127.0.0.1:18091"},
			func(c *gatewayConfig) bool { return c.APIListen == "127.0.0.1:18091" }},
		{"the new variable wins over the former one", nil,
			map[string]string{"PROXYFLEET_API_LISTEN": "127.0.0.1:18091", "PROXYFLEET_LEASE_API_LISTEN": "127.0.0.1:18092"},
			func(c *gatewayConfig) bool { return c.APIListen == "127.0.0.1:18092" }},
		{"api-listen and api-token-file as --config keys",
			[]string{"--config", writeFile(t, "c.yaml", "api-listen: 127.0.0.1:18093\napi-token-file: "+tokens+"\n")}, nil,
			func(c *gatewayConfig) bool { return c.APIListen == "127.0.0.1:18093" && c.APIToken == "api-s3cret" }},
		{"--pool-api on the command line", []string{"--pool-api", "http://127.0.0.1:18094"}, nil,
			func(c *gatewayConfig) bool { return c.PoolAPI == "http://127.0.0.1:18094" }},
		{"PROXYFLEET_POOL_API", nil, map[string]string{"PROXYFLEET_POOL_API": "http://127.0.0.1:18095"},
			func(c *gatewayConfig) bool { return c.PoolAPI == "http://127.0.0.1:18095" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := runConfig(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(cfg) {
				t.Fatalf("the former name did not set the flag: %+v", cfg.Config)
			}
		})
	}
	var help bytes.Buffer
	for _, cmd := range newApp().Commands {
		app := newApp()
		app.Writer = &help
		if err := app.Run([]string{"proxyfleet", cmd.Name, "--help"}); err != nil {
			t.Fatal(err)
		}
	}
	for newName, old := range formerNames {
		if !strings.Contains(help.String(), "--"+newName+" ") || !strings.Contains(help.String(), "--"+old+" ") {
			t.Errorf("no --help lists --%s with its former name --%s", newName, old)
		}
	}
}

func TestVersionPrintsTheVersion(t *testing.T) {
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	if err := app.Run([]string{"proxyfleet", "version"}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "proxyfleet "+version+"\n"; got != want {
		t.Fatalf("version printed %q, want %q", got, want)
	}
}

// startGateway runs the real command with args until the startup message
// appears, and stops it at the end of the test.
func startGateway(t *testing.T, args ...string) *daemontest.Gateway {
	t.Helper()
	return daemontest.Start(t, func(ctx context.Context, stderr io.Writer) error {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, stderr
		return app.RunContext(ctx, append([]string{"proxyfleet", "gateway"}, args...))
	})
}

func TestListenFailureNamesTheAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"proxy port in use", []string{"--listen", addr, "--metrics-listen", "off"}, "--listen " + addr},
		{"metrics port in use", []string{"--listen", "127.0.0.1:0", "--metrics-listen", addr}, "--metrics-listen " + addr},
		{"api port in use", []string{"--listen", "127.0.0.1:0", "--metrics-listen", "off", "--lease-api-listen", addr}, "--lease-api-listen " + addr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newApp()
			app.Writer, app.ErrWriter = io.Discard, io.Discard
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := app.RunContext(ctx, append([]string{"proxyfleet", "gateway"}, tt.args...))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("error = %v, want one naming %q and the cause", err, tt.want)
			}
		})
	}
}

// clientNames are cfg's token clients' names, joined by commas.
func clientNames(cfg *gatewayConfig) string {
	names := make([]string, len(cfg.Clients))
	for i, c := range cfg.Clients {
		names[i] = c.Name
	}
	return strings.Join(names, ",")
}

func TestClientTokensFromTheTokenFileAreEnforced(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer target.Close()
	tokens := writeFile(t, "tokens", "# crawlers\na tok-1 all\nb tok-2 all\n")
	g := startGateway(t, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--allow-private-targets", "--auth-token-file", tokens)
	if out := g.Stderr.String(); strings.Contains(out, "tok-1") || !strings.Contains(out, "http://crawler:$TOKEN@"+g.Proxy) {
		t.Errorf("startup message must show where the token goes and never a token:\n%s", out)
	}

	tests := []struct {
		name     string
		userinfo *url.Userinfo
		want     int
	}{
		{"no credentials", nil, http.StatusProxyAuthRequired},
		{"unknown token", url.UserPassword("crawler", "tok-3"), http.StatusProxyAuthRequired},
		{"first token", url.UserPassword("crawler", "tok-1"), http.StatusOK},
		{"second token with a session", url.UserPassword("crawler-session-s1", "tok-2"), http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proxyURL := &url.URL{Scheme: "http", Host: g.Proxy, User: tt.userinfo}
			client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 20 * time.Second}
			if code, body := daemontest.Get(t, client, target.URL); code != tt.want {
				t.Fatalf("status %d (%q), want %d", code, body, tt.want)
			}
		})
	}
	if strings.Contains(g.Stderr.String(), "tok-") {
		t.Errorf("a token reached the log:\n%s", g.Stderr.String())
	}
}

// A value the flag package cannot parse is answered with what the flag
// wants, on every command: "parse error" alone sent people to the docs
// (a duration without its unit, the usual slip, read the same as a typo).
func TestAnUnparsableFlagValueSaysWhatTheFlagWants(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gateway", "--lease-ttl", "5"}, `invalid value "5" for flag --lease-ttl: want a duration with a unit, such as 30s, 10m or 1h30m (see proxyfleet gateway --help)`},
		{[]string{"gateway", "--retries", "x"}, `--retries: want a whole number`},
		{[]string{"controller", "--leader-elect=maybe"}, `--leader-elect: want true or false (see proxyfleet controller --help)`},
		{[]string{"lease", "acquire", "--ttl", "5"}, `--ttl: want a duration with a unit, such as 30s, 10m or 1h30m (see proxyfleet lease acquire --help)`},
		{[]string{"mitm-ca", "init", "--validity", "5"}, `--validity: want a duration with a unit`},
	} {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		err := app.Run(append([]string{"proxyfleet"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestPacingRuleFlags: the learning rule's parameters come from flags and
// YAML, default to rotation.DefaultPaceRule, and a bad value is refused at
// start naming the flag.
func TestPacingRuleFlags(t *testing.T) {
	cfg, err := runConfig(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Pacing.Rule != rotation.DefaultPaceRule {
		t.Fatalf("default rule %+v, want %+v", cfg.Pacing.Rule, rotation.DefaultPaceRule)
	}
	config := writeFile(t, "config.yaml", "pacing-window: 30s\npacing-increase-steps: 20\npacing-memory: 1h\n")
	if cfg, err = runConfig(t, "--config", config); err != nil {
		t.Fatal(err)
	}
	if want := (rotation.PaceRule{Window: 30 * time.Second, IncreaseSteps: 20, Memory: time.Hour}); cfg.Pacing.Rule != want {
		t.Fatalf("rule from YAML %+v, want %+v", cfg.Pacing.Rule, want)
	}
	if cfg, err = runConfig(t, "--pacing-window", "0s", "--pacing-memory", "0s"); err != nil || cfg.Pacing.Rule.Window != 0 || cfg.Pacing.Rule.Memory != 0 {
		t.Fatalf("0 turns the rule's window and memory off: %+v, %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pacing-window", "-1s"}, "--pacing-window -1s: must be 0 to 10m0s"},
		{[]string{"--pacing-window", "1h"}, "--pacing-window 1h0m0s: must be 0 to 10m0s"},
		{[]string{"--pacing-increase-steps", "0"}, "--pacing-increase-steps 0: must be 1 to 1000000"},
		{[]string{"--pacing-memory", "-1h"}, "--pacing-memory -1h0m0s: must be 0 to 168h0m0s"},
	} {
		cfg, err := runConfig(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || cfg != nil {
			t.Errorf("%v: %v, want a refusal %q before the runner", tc.args, err, tc.want)
		}
	}
}

// docsBlock is the first ```lang block after heading in a docs/ page.
func docsBlock(t *testing.T, page, heading, lang string) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/" + page)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/%s has no %q", page, heading)
	}
	text = text[i:]
	j := strings.Index(text, "```"+lang+"\n")
	if j < 0 {
		t.Fatalf("no ```%s block after %q", lang, heading)
	}
	text = text[j+len(lang)+4:]
	return text[:strings.Index(text, "```")]
}

// The upgrade of docs/tenancy.md#upgrading-a-token-file: a token file of
// the format before token clients stops the gateway at start, naming the
// line and never the token; the documented command migrates it; the same
// token is then served.
func TestAnOldTokenFileStopsTheGatewayUntilItIsMigrated(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer target.Close()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# crawler tokens\nold-tok-1\n\nold-tok-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := runConfig(t, "--auth-token-file", tokens)
	if err == nil || !strings.Contains(err.Error(), "--auth-token-file "+tokens+": line 2: a token without a client name") || strings.Contains(err.Error(), "old-tok") {
		t.Fatalf("an old token file: %v, want a refusal naming the flag and line 2, never the token", err)
	}

	cmd := exec.Command("sh", "-c", docsBlock(t, "tenancy.md", "### Upgrading a token file", "sh"))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the documented migration failed: %v\n%s", err, out)
	}
	g := startGateway(t, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--allow-private-targets", "--auth-token-file", tokens)
	for _, tok := range []string{"old-tok-1", "old-tok-2"} {
		proxyURL := &url.URL{Scheme: "http", Host: g.Proxy, User: url.UserPassword("crawler", tok)}
		client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 20 * time.Second}
		if code, body := daemontest.Get(t, client, target.URL); code != http.StatusOK {
			t.Fatalf("%s after the migration: status %d (%q), want 200", tok, code, body)
		}
	}
	migrated, _ := os.ReadFile(tokens)
	if !strings.Contains(string(migrated), "client-1 old-tok-1 all\n") || !strings.Contains(string(migrated), "client-2 old-tok-2 all\n") || !strings.HasPrefix(string(migrated), "# crawler tokens\n") {
		t.Fatalf("migrated file:\n%s", migrated)
	}
}
