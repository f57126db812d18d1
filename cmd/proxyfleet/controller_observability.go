//go:build !sidecar

package main

import (
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/internal/logging"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
)

// controllerLogger builds the process logger (logging.New) and makes it
// every logger of the process: the slog and standard-library default
// (controller-runtime's metrics and probe servers log their errors
// there), controller-runtime's and klog's (client-go's leader election
// and informers log through klog). It returns it as the logr.Logger
// controller-runtime hands to every reconcile. klog.SetLogger, unlike
// klog.SetSlogLogger with a level mapping, keeps klog's own verbosity
// gate: klog.V(n) lines above klog's -v (0 here) are dropped before they
// reach the logger.
func controllerLogger(w io.Writer, level slog.Level, json bool) logr.Logger {
	l := logging.New(w, level, json)
	logging.Install(l)
	logger := logging.Logr(l)
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return logger
}

// flagTraceHealthProbes turns on a span per health probe.
const flagTraceHealthProbes = "trace-health-probes"

// tracingFlags are the controller's tracing flags; the exporter itself is
// configured by the standard OTEL_* environment (docs/operations.md).
func tracingFlags() []cli.Flag {
	return []cli.Flag{
		boolFlag(flagTraceHealthProbes, "also trace every health probe (health.probe spans: one per Proxy per interval); needs an exporter from OTEL_TRACES_EXPORTER"),
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
