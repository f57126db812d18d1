//go:build !sidecar

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/poolapi"
)

func TestControllerRejectsBadLeaseAPIFlagsNamingTheFlag(t *testing.T) {
	two := writeFile(t, "two-tokens", "a\nb\n")
	empty := writeFile(t, "empty", "# nothing\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "listen without a port", args: []string{"--lease-api-listen", "127.0.0.1"}, want: "--lease-api-listen"},
		{name: "listen from the environment", env: map[string]string{"PROXYFLEET_LEASE_API_LISTEN": "nope"}, want: "--lease-api-listen"},
		{name: "token file with two tokens", args: []string{"--lease-api-token-file", two}, want: "--lease-api-token-file"},
		{name: "token file without a token", args: []string{"--lease-api-token-file", empty}, want: "--lease-api-token-file"},
		{name: "zero cooldown", args: []string{"--cooldown", "0s"}, want: "--cooldown 0s: must be positive"},
		{name: "max cooldown below cooldown", args: []string{"--cooldown", "2h"}, want: "--max-cooldown 1h0m0s is below --cooldown 2h0m0s"},
		{name: "lease ttl above its max", args: []string{"--max-lease-ttl", "30s"}, want: "--lease-ttl 1m0s is above --max-lease-ttl 30s"},
		{name: "negative failure cooldown", args: []string{"--failure-cooldown", "-1s"}, want: "--failure-cooldown"},
		{name: "zero site failure cooldown", args: []string{"--site-failure-cooldown", "0s"}, want: "--site-failure-cooldown 0s: must be positive"},
		{name: "negative lease cap", args: []string{"--max-leases-per-member", "-1"}, want: "--max-leases-per-member -1"},
		{name: "malformed lease store", args: []string{"--lease-store", "redis+sentinel://:pw@s:1"}, want: "--lease-store: lease store URL \"redis+sentinel://:xxxxx@s:1\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := runControllerArgs(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\na\n") {
				t.Fatalf("error %q shows the token file's content", err)
			}
		})
	}
}

// leaseAPIContext parses args with the controller's lease API flags only.
func leaseAPIContext(t *testing.T, args ...string) *cli.Context {
	t.Helper()
	set := flag.NewFlagSet("controller", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for _, f := range controllerLeaseAPIFlags() {
		if err := f.Apply(set); err != nil {
			t.Fatal(err)
		}
	}
	if err := set.Parse(args); err != nil {
		t.Fatal(err)
	}
	return cli.NewContext(cli.NewApp(), set, nil)
}

func TestLeaseAPISettings(t *testing.T) {
	token := writeFile(t, "token", "# the lease API token\ns3cret\n")
	tests := []struct {
		name   string
		args   []string
		listen string
		token  string
		check  func(pool.StoreOptions) bool
	}{
		{name: "defaults serve on :8090 without a token", listen: ":8090",
			check: func(o pool.StoreOptions) bool {
				return o.DefaultTTL == pool.DefaultLeaseTTL && o.MaxTTL == pool.DefaultMaxLeaseTTL &&
					o.Cooldown.Default == pool.DefaultCooldown && o.Cooldown.Max == pool.DefaultMaxCooldown &&
					o.FailureWindow == pool.DefaultFailureWindow && o.MaxLeasesPerMember == 0
			}},
		{name: "0 turns the API off", args: []string{"--lease-api-listen", "0"}, listen: ""},
		{name: "a token file and store flags", args: []string{"--lease-api-listen", "127.0.0.1:9000", "--lease-api-token-file", token,
			"--cooldown", "5m", "--max-leases-per-member", "3"}, listen: "127.0.0.1:9000", token: "s3cret",
			check: func(o pool.StoreOptions) bool {
				return o.Cooldown.Default == 5*time.Minute && o.MaxLeasesPerMember == 3
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := parseLeaseAPIFlags(leaseAPIContext(t, tt.args...))
			if err != nil {
				t.Fatal(err)
			}
			if s.listen != tt.listen || s.token != tt.token {
				t.Fatalf("listen %q token %q, want %q %q", s.listen, s.token, tt.listen, tt.token)
			}
			if tt.check != nil && !tt.check(s.store) {
				t.Fatalf("store options %+v", s.store)
			}
		})
	}
}

func TestSetupLeaseAPIServesAndExportsItsMetrics(t *testing.T) {
	env := testenv.Start(t)
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{ProxyNamespace: env.Namespace(t), MetricsAddr: "0", Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api, err := setupLeaseAPI(mgr, leaseAPISettings{listen: "127.0.0.1:0", token: "tok"}, reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a busy port names the flag", func(t *testing.T) {
		_, err := setupLeaseAPI(mgr, leaseAPISettings{listen: api.Addr().String()}, prometheus.NewRegistry(), logr.Discard())
		if err == nil || !strings.Contains(err.Error(), "--lease-api-listen "+api.Addr().String()) {
			t.Fatalf("error = %v, want one naming --lease-api-listen", err)
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	c, err := poolapi.NewClient("http://"+api.Addr().String(), "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the lease API to answer an acquire on the empty pool", func() error {
		_, err := c.Acquire(context.Background(), pool.AcquireRequest{})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) {
			return fmt.Errorf("acquire on an empty pool = %v, want a 409", err)
		}
		return nil
	})
	if n := testutil.CollectAndCount(reg, "proxyfleet_lease_requests_total"); n != 1 {
		t.Fatalf("%d proxyfleet_lease_requests_total series, want the no_match one", n)
	}
	want := `
# HELP proxyfleet_leases_active Unexpired leases in the pool.
# TYPE proxyfleet_leases_active gauge
proxyfleet_leases_active 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_leases_active"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + api.Addr().String() + "/v1/proxies")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/proxies without the token = %d, want 401", resp.StatusCode)
	}
}
