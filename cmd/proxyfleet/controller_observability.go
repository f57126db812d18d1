//go:build !sidecar

package main

import "github.com/urfave/cli/v2"

// flagTraceHealthProbes turns on a span per health probe.
const flagTraceHealthProbes = "trace-health-probes"

// tracingFlags are the controller's tracing flags; the exporter itself is
// configured by the standard OTEL_* environment (docs/operations.md).
func tracingFlags() []cli.Flag {
	return []cli.Flag{
		boolFlag(flagTraceHealthProbes, "also trace every health probe (health.probe spans: one per Proxy per interval); needs an exporter from OTEL_TRACES_EXPORTER"),
	}
}
