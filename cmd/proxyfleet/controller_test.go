package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
