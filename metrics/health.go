package metrics

import (
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// HealthChecks holds the controller's health-engine vectors, labelled by
// Proxy ("namespace/name"). Every probe is observed here, status-affecting or
// not: status writes are transition-only, so these series are where probe
// recency and flapping are visible. It satisfies health.ProbeMetrics.
type HealthChecks struct {
	duration  *prometheus.HistogramVec
	failures  *prometheus.CounterVec
	lastProbe *prometheus.GaugeVec
}

// NewHealthChecks creates proxyfleet_healthcheck_duration_seconds,
// proxyfleet_healthcheck_failures_total and
// proxyfleet_healthcheck_last_probe_timestamp_seconds and registers them with
// reg. It panics if reg already holds them (a wiring bug).
func NewHealthChecks(reg prometheus.Registerer) *HealthChecks {
	h := &HealthChecks{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "healthcheck", Name: "duration_seconds",
			Help:    "Duration of every health probe through a Proxy, successful or not.",
			Buckets: probeBuckets,
		}, []string{"proxy"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "healthcheck", Name: "failures_total",
			Help: "Failed health probes through a Proxy.",
		}, []string{"proxy"}),
		lastProbe: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "healthcheck", Name: "last_probe_timestamp_seconds",
			Help: "Unix time the latest probe through a Proxy finished; status.lastHealthCheckTime moves only on status-affecting probes.",
		}, []string{"proxy"}),
	}
	reg.MustRegister(h.duration, h.failures, h.lastProbe)
	return h
}

// ObserveProbe records one probe through proxy: its duration, a failure when
// ok is false (an explicit zero otherwise, what failure-ratio alerts divide
// by), and the time it finished.
func (h *HealthChecks) ObserveProbe(proxy string, d time.Duration, ok bool) {
	h.duration.WithLabelValues(proxy).Observe(d.Seconds())
	c := h.failures.WithLabelValues(proxy)
	if !ok {
		c.Inc()
	}
	h.lastProbe.WithLabelValues(proxy).SetToCurrentTime()
}

// Forget deletes proxy's series; the engine calls it when it prunes the
// Proxy's state (deleted, being deleted, or without an address).
func (h *HealthChecks) Forget(proxy string) {
	l := prometheus.Labels{"proxy": proxy}
	h.duration.Delete(l)
	h.failures.Delete(l)
	h.lastProbe.Delete(l)
}
