//go:build !sidecar

package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/controller/manager"
)

// Flags of the health engine.
const (
	flagHealthTick              = "health-tick"
	flagHealthWorkers           = "health-workers"
	flagDefaultProbeURL         = "default-probe-url"
	flagHealthMinReportInterval = "health-min-report-interval"
)

// healthFlags are the health engine's flags; controllerCommand appends them
// to its own.
func healthFlags() []cli.Flag {
	return []cli.Flag{
		durationFlag(flagHealthTick, health.DefaultTick.String(), "how often the health engine looks for due probes (a probe is at most this late)"),
		intFlag(flagHealthWorkers, health.DefaultWorkers, "health probes run at once"),
		stringFlag(flagDefaultProbeURL, "", "`URL` (http:// or https://) probed through Proxies whose spec.healthCheck.url is empty; "+
			"without it such Proxies are not probed and get no Healthy verdict"),
		durationFlag(flagHealthMinReportInterval, health.DefaultMinReportInterval.String(), "least time between two latency-only status updates of a healthy Proxy"),
	}
}

// readHealth reads the health engine flags, naming the one that is wrong;
// a bad probe URL is echoed redacted.
func (cfg *controllerConfig) readHealth(c *cli.Context) error {
	cfg.Health = manager.Health{
		Tick:              c.Duration(flagHealthTick),
		MinReportInterval: c.Duration(flagHealthMinReportInterval),
		Workers:           c.Int(flagHealthWorkers),
		DefaultProbeURL:   c.String(flagDefaultProbeURL),
		TraceProbes:       c.Bool(flagTraceHealthProbes),
	}
	return checkHealth(cfg.Health)
}

// checkHealth names the first health engine flag whose value is wrong.
func checkHealth(h manager.Health) error {
	if h.Tick <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagHealthTick, h.Tick)
	}
	if h.Workers < 1 {
		return fmt.Errorf("--%s must be at least 1, got %d", flagHealthWorkers, h.Workers)
	}
	if h.MinReportInterval <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagHealthMinReportInterval, h.MinReportInterval)
	}
	if h.DefaultProbeURL != "" {
		if _, err := health.ParseProbeURL(h.DefaultProbeURL); err != nil {
			return fmt.Errorf("--%s: %w", flagDefaultProbeURL, err)
		}
	}
	return nil
}
