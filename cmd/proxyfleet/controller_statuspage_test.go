//go:build !sidecar

package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestControllerRejectsABadStatusListenNamingTheFlag(t *testing.T) {
	for _, addr := range []string{"8082", "127.0.0.1:http-nope", "a:b:c"} {
		t.Run(addr, func(t *testing.T) {
			if err := runControllerArgs(t, "--status-listen", addr); err == nil || !strings.Contains(err.Error(), "--status-listen") {
				t.Fatalf("--status-listen %s: error = %v, want one naming --status-listen", addr, err)
			}
		})
	}
	t.Setenv("PROXYFLEET_STATUS_LISTEN", "nope")
	if err := runControllerArgs(t); err == nil || !strings.Contains(err.Error(), "--status-listen") {
		t.Fatalf("PROXYFLEET_STATUS_LISTEN=nope: error = %v, want one naming --status-listen", err)
	}
}

// statusListenFor parses args with only the status flags.
func statusListenFor(t *testing.T, args ...string) string {
	t.Helper()
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	for _, f := range statusFlags() {
		if err := f.Apply(fs); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	var cfg controllerConfig
	if err := cfg.readStatus(cli.NewContext(cli.NewApp(), fs, nil)); err != nil {
		t.Fatal(err)
	}
	return cfg.StatusListen
}

func TestStatusListenDefaultsToLoopbackAndZeroTurnsItOff(t *testing.T) {
	if s := statusListenFor(t); s != "127.0.0.1:8082" {
		t.Fatalf("default: %q, want 127.0.0.1:8082", s)
	}
	for _, off := range []string{"0", "off", ""} {
		if s := statusListenFor(t, "--status-listen", off); s != "" {
			t.Fatalf("--status-listen %q: %q, want off", off, s)
		}
	}
}

// TestControllerStatusPageIsNeverOpenByAccident: the page has no
// authentication and lists the fleet, so a non-loopback --status-listen
// is refused at start unless --insecure-allow-open says so.
func TestControllerStatusPageIsNeverOpenByAccident(t *testing.T) {
	refusal := "--status-listen :8082 is not loopback"
	for _, tc := range []struct {
		name, listen string
		open         bool
		want         string // "" for accepted
	}{
		{"every interface is refused", ":8082", false, refusal},
		{"a pod IP is refused", "10.1.2.3:8082", false, "--status-listen 10.1.2.3:8082 is not loopback"},
		{"told to be open serves", ":8082", true, ""},
		{"the default loopback address serves", "127.0.0.1:8082", false, ""},
		{"localhost serves", "localhost:8082", false, ""},
		{"IPv6 loopback serves", "[::1]:8082", false, ""},
		{"off needs nothing", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStatusOpen(tc.listen, tc.open)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--insecure-allow-open") {
				t.Fatalf("error = %v, want one containing %q and naming --insecure-allow-open", err, tc.want)
			}
		})
	}
}
