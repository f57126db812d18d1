package manager

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/metrics"
)

// setupHealth adds the health engine to mgr, connects it to the reconciler
// pr (call before pr.SetupWithManager) and registers its probe metrics.
func (r *run) setupHealth(mgr ctrl.Manager, pr *controller.ProxyReconciler) (*health.Engine, error) {
	h := r.cfg.Health
	e, err := controller.SetupHealthEngine(mgr, pr, health.Options{
		Tick:              h.Tick,
		Workers:           h.Workers,
		DefaultProbeURL:   h.DefaultProbeURL,
		MinReportInterval: h.MinReportInterval,
		Metrics:           health.TraceProbes(metrics.NewHealthChecks(r.reg), r.probeTracerProvider()),
		Logger:            r.log.WithName("health"),
	})
	if err != nil {
		return nil, fmt.Errorf("setting up the health engine: %w", err)
	}
	if h.DefaultProbeURL == "" {
		r.log.Info("no " + or(r.cfg.Names.DefaultProbeURL, "Health.DefaultProbeURL") + ": Proxies without spec.healthCheck.url are not probed, " +
			"get no Healthy verdict and are never offered by the lease API")
	}
	return e, nil
}

// probeTracerProvider is what health probes are traced on: the run's
// tracer provider with Health.TraceProbes, else nil (no probe spans).
func (r *run) probeTracerProvider() trace.TracerProvider {
	if !r.cfg.Health.TraceProbes {
		return nil
	}
	if !r.tr.Enabled() {
		r.log.Info(or(r.cfg.Names.TraceProbes, "Health.TraceProbes") + " has no effect: no trace exporter is configured (OTEL_TRACES_EXPORTER)")
	}
	return r.tr.TracerProvider()
}
