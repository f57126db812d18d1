//go:build !sidecar

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/controller/manager"
)

func TestControllerRejectsBadHealthFlagsNamingTheFlag(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    string
		secrets string // must not appear in the error
	}{
		{name: "a zero tick", args: []string{"--health-tick", "0s"}, want: "--health-tick"},
		{name: "no workers", args: []string{"--health-workers", "0"}, want: "--health-workers"},
		{name: "a zero minimum report interval", args: []string{"--health-min-report-interval", "0s"}, want: "--health-min-report-interval"},
		{name: "a probe URL that is not http or https", args: []string{"--default-probe-url", "ftp://example.org/"}, want: "--default-probe-url"},
		{name: "a probe URL without a host", args: []string{"--default-probe-url", "http:///generate_204"}, want: "--default-probe-url"},
		{
			name: "a bad probe URL is echoed without its password", args: []string{"--default-probe-url", "ftp://probe:hunter2@example.org/"},
			want: "--default-probe-url", secrets: "hunter2",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := runControllerArgs(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one naming %s", err, tc.want)
			}
			if tc.secrets != "" && strings.Contains(err.Error(), tc.secrets) {
				t.Fatalf("error leaks the URL's password: %v", err)
			}
		})
	}
}

func TestHealthFlagsReadTheEnvironment(t *testing.T) {
	t.Setenv("PROXYFLEET_HEALTH_WORKERS", "0")
	if err := runControllerArgs(t); err == nil || !strings.Contains(err.Error(), "--health-workers") {
		t.Fatalf("PROXYFLEET_HEALTH_WORKERS=0: error = %v, want one naming --health-workers", err)
	}
}

func TestHealthSettingsAcceptTheDocumentedValues(t *testing.T) {
	tests := []struct {
		name string
		s    manager.Health
	}{
		{"the defaults, no default probe URL", manager.Health{Tick: health.DefaultTick, Workers: health.DefaultWorkers, MinReportInterval: health.DefaultMinReportInterval}},
		{"an https default probe URL", manager.Health{Tick: 100 * time.Millisecond, Workers: 1, MinReportInterval: time.Second, DefaultProbeURL: "https://example.org/generate_204"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkHealth(tc.s); err != nil {
				t.Fatalf("validate: %v", err)
			}
		})
	}
}
