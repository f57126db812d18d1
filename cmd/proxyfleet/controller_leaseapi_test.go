//go:build !sidecar

package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/pool"
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
		{name: "unknown tenancy", args: []string{"--lease-api-tenancy", "open"}, want: `--lease-api-tenancy "open": want namespaced or cluster-wide`},
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

func TestControllerLeaseAPIIsNeverOpenByAccident(t *testing.T) {
	token := writeFile(t, "token", "s3cret\n")
	refusal := "--lease-api-listen :8090 is not loopback: set --lease-api-token-file or --lease-api-token-review, --lease-api-listen 0 to turn the API off, or --insecure-allow-open to serve it without auth"
	tests := []struct {
		name string
		args []string
		want string // "" for accepted
	}{
		{name: "the default address without auth is refused", want: refusal},
		{name: "all interfaces without auth is refused", args: []string{"--lease-api-listen", "0.0.0.0:8090"}, want: "--lease-api-listen 0.0.0.0:8090 is not loopback"},
		{name: "a pod IP without auth is refused", args: []string{"--lease-api-listen", "10.1.2.3:8090"}, want: "--lease-api-listen 10.1.2.3:8090 is not loopback"},
		{name: "a token file serves", args: []string{"--lease-api-token-file", token}},
		{name: "token review alone serves", args: []string{"--lease-api-token-review"}},
		{name: "told to be open serves", args: []string{"--insecure-allow-open"}},
		{name: "loopback needs no auth", args: []string{"--lease-api-listen", "127.0.0.1:8090"}},
		{name: "localhost needs no auth", args: []string{"--lease-api-listen", "localhost:8090"}},
		{name: "IPv6 loopback needs no auth", args: []string{"--lease-api-listen", "[::1]:8090"}},
		{name: "off needs no auth", args: []string{"--lease-api-listen", "0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := leaseAPIContext(t, tt.args...)
			s, err := leaseAPIFrom(c)
			if err != nil {
				t.Fatal(err)
			}
			err = checkLeaseAPIAuth(s, c.Bool(flagInsecureAllowOpen))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestControllerWithDefaultFlagsRefusesAnOpenLeaseAPI(t *testing.T) {
	_, err := parseControllerConfigAsIs(t)
	if err == nil || !strings.Contains(err.Error(), "--lease-api-listen :8090 is not loopback") {
		t.Fatalf("error = %v, want the open lease API refused", err)
	}
	// A wrong flag is named before the refusal.
	if _, err := parseControllerConfigAsIs(t, "--drift-poll", "0s"); err == nil || !strings.Contains(err.Error(), "--drift-poll") {
		t.Fatalf("error = %v, want one naming --drift-poll", err)
	}
}

func TestLeaseAPITenancyIsNamespacedUnlessToldClusterWide(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"the default is namespaced", nil, "", leases.TenancyNamespaced},
		{"cluster-wide keeps the behaviour before ProxyGrants", []string{"--lease-api-tenancy", "cluster-wide"}, "", leases.TenancyClusterWide},
		{"the environment sets it too", nil, "cluster-wide", leases.TenancyClusterWide},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("PROXYFLEET_LEASE_API_TENANCY", tt.env)
			}
			s, err := leaseAPIFrom(leaseAPIContext(t, tt.args...))
			if err != nil {
				t.Fatal(err)
			}
			if s.Tenancy != tt.want {
				t.Fatalf("tenancy %q, want %q", s.Tenancy, tt.want)
			}
		})
	}
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
		{name: "defaults serve on :8090 with a token", args: []string{"--lease-api-token-file", token}, listen: ":8090", token: "s3cret",
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
			s, err := leaseAPIFrom(leaseAPIContext(t, tt.args...))
			if err != nil {
				t.Fatal(err)
			}
			if s.Listen != tt.listen || s.Token != tt.token {
				t.Fatalf("listen %q token %q, want %q %q", s.Listen, s.Token, tt.listen, tt.token)
			}
			if tt.check != nil && !tt.check(s.Store) {
				t.Fatalf("store options %+v", s.Store)
			}
		})
	}
}
