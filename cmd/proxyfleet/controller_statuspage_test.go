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
