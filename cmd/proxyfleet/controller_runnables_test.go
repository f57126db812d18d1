//go:build !sidecar

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/controller/gc"
	"github.com/proxyfleet/proxyfleet/controller/manager"
)

func TestControllerRejectsBadRunnableFlagsNamingTheFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a zero GC interval", []string{"--gc-interval", "0s"}, "--gc-interval"},
		{"a negative GC minimum age", []string{"--gc-min-age", "-1m"}, "--gc-min-age"},
		{"a check interval under the 10s floor", []string{"--provider-check-interval", "5s"}, "--provider-check-interval"},
		{"a negative check interval", []string{"--provider-check-interval", "-1m"}, "--provider-check-interval"},
		{"a negative check timeout", []string{"--provider-check-timeout", "-1s"}, "--provider-check-timeout"},
		{"a check timeout longer than the interval", []string{"--provider-check-interval", "20s", "--provider-check-timeout", "30s"}, "--provider-check-timeout"},
		{"a namespaced controller with providers but no GC opt-in", []string{"--proxy-namespace", "crawl", "--providers-config", "/nonexistent.yaml"}, "--gc-allow-namespaced"},
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

func TestRunnableFlagsReadTheEnvironment(t *testing.T) {
	t.Setenv("PROXYFLEET_PROVIDER_CHECK_INTERVAL", "3s")
	if err := runControllerArgs(t); err == nil || !strings.Contains(err.Error(), "--provider-check-interval") {
		t.Fatalf("PROXYFLEET_PROVIDER_CHECK_INTERVAL=3s: error = %v, want one naming --provider-check-interval", err)
	}
}

func TestRunnableSettingsAcceptTheDocumentedValues(t *testing.T) {
	tests := []struct {
		name string
		gc   manager.GC
		pc   manager.ProviderChecks
	}{
		{"the defaults", manager.GC{Interval: gc.DefaultInterval, MinAge: gc.DefaultMinAge}, manager.ProviderChecks{Interval: time.Minute}},
		{"checks off with a timeout set", manager.GC{Interval: time.Minute, MinAge: time.Minute}, manager.ProviderChecks{Timeout: time.Hour}},
		{"a 12s interval without a timeout (it derives 12s)", manager.GC{Interval: time.Minute, MinAge: time.Minute}, manager.ProviderChecks{Interval: 12 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkRunnables(tc.gc, tc.pc); err != nil {
				t.Fatalf("validate: %v", err)
			}
		})
	}
}
