//go:build !sidecar

package main

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
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
		durationFlag(flagHealthTick, health.DefaultTick, "how often the health engine looks for due probes (a probe is at most this late)"),
		intFlag(flagHealthWorkers, health.DefaultWorkers, "health probes run at once"),
		stringFlag(flagDefaultProbeURL, "", "`URL` (http:// or https://) probed through Proxies whose spec.healthCheck.url is empty; "+
			"without it such Proxies are not probed and get no Healthy verdict"),
		durationFlag(flagHealthMinReportInterval, health.DefaultMinReportInterval, "least time between two latency-only status updates of a healthy Proxy"),
	}
}

// healthSettings are the parsed health engine flags.
type healthSettings struct {
	tick, minReport time.Duration
	workers         int
	defaultProbeURL string
	probeTracing    trace.TracerProvider // nil: probes make no spans
}

// parseHealthFlags validates the health engine flags, naming the one that is
// wrong; a bad probe URL is echoed redacted.
func parseHealthFlags(c *cli.Context) (healthSettings, error) {
	s := healthSettings{
		tick:            c.Duration(flagHealthTick),
		minReport:       c.Duration(flagHealthMinReportInterval),
		workers:         c.Int(flagHealthWorkers),
		defaultProbeURL: c.String(flagDefaultProbeURL),
	}
	return s, s.validate()
}

func (s healthSettings) validate() error {
	if s.tick <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagHealthTick, s.tick)
	}
	if s.workers < 1 {
		return fmt.Errorf("--%s must be at least 1, got %d", flagHealthWorkers, s.workers)
	}
	if s.minReport <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagHealthMinReportInterval, s.minReport)
	}
	if s.defaultProbeURL != "" {
		if _, err := health.ParseProbeURL(s.defaultProbeURL); err != nil {
			return fmt.Errorf("--%s: %w", flagDefaultProbeURL, err)
		}
	}
	return nil
}

// setupHealth adds the health engine to mgr, connects it to the reconciler r
// (call before r.SetupWithManager) and registers its probe metrics with reg.
func setupHealth(mgr ctrl.Manager, r *controller.ProxyReconciler, s healthSettings, reg prometheus.Registerer, logger logr.Logger) (*health.Engine, error) {
	e, err := controller.SetupHealthEngine(mgr, r, health.Options{
		Tick:              s.tick,
		Workers:           s.workers,
		DefaultProbeURL:   s.defaultProbeURL,
		MinReportInterval: s.minReport,
		Metrics:           tracing.TraceProbes(metrics.NewHealthChecks(reg), s.probeTracing),
		Logger:            logger.WithName("health"),
	})
	if err != nil {
		return nil, fmt.Errorf("setting up the health engine: %w", err)
	}
	if s.defaultProbeURL == "" {
		logger.Info("no --" + flagDefaultProbeURL + ": Proxies without spec.healthCheck.url are not probed, " +
			"get no Healthy verdict and are never offered by the lease API")
	}
	return e, nil
}
