//go:build !sidecar

package main

import (
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/internal/logging"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
)

// controllerLogger builds the process logger (logging.New), installs it as
// the slog and standard-library default — controller-runtime's metrics
// and probe servers log their errors there — and returns it as the
// logr.Logger controller-runtime hands to every reconcile.
func controllerLogger(w io.Writer, level slog.Level, json bool) logr.Logger {
	l := logging.New(w, level, json)
	logging.Install(l)
	return logging.Logr(l)
}

// flagTraceHealthProbes turns on a span per health probe.
const flagTraceHealthProbes = "trace-health-probes"

// tracingFlags are the controller's tracing flags; the exporter itself is
// configured by the standard OTEL_* environment (docs/operations.md).
func tracingFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: flagTraceHealthProbes, EnvVars: []string{envVar(flagTraceHealthProbes)},
			Usage: "also trace every health probe (health.probe spans: one per Proxy per interval); needs an exporter from OTEL_TRACES_EXPORTER"},
	}
}

// probeTracerProvider is what health probes are traced on: tr's provider
// with --trace-health-probes, else nil (no probe spans).
func probeTracerProvider(c *cli.Context, tr *tracing.Tracing, logger logr.Logger) trace.TracerProvider {
	if !c.Bool(flagTraceHealthProbes) {
		return nil
	}
	if !tr.Enabled() {
		logger.Info("--" + flagTraceHealthProbes + " has no effect: no trace exporter is configured (OTEL_TRACES_EXPORTER)")
	}
	return tr.TracerProvider()
}
