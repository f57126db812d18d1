package metrics

import (
	"context"
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// ProxyPhases is what the Proxy collector reads at every scrape: how many
// Proxies are in each phase. The controller's cache-backed counter
// satisfies it; it must be safe for concurrent use.
type ProxyPhases interface {
	ProxiesByPhase(ctx context.Context) (map[string]int, error)
}

// DefaultProxyScrapeTimeout bounds one read of the Proxy counts: a cache that
// has not synced yet must not hold a scrape past Prometheus's own timeout.
const DefaultProxyScrapeTimeout = 5 * time.Second

// proxyCollector reads the Proxy counts at scrape time instead of keeping a
// gauge the reconciler updates: such a gauge drifts with every missed
// transition and keeps series of phases and Proxies long gone.
type proxyCollector struct {
	src     ProxyPhases
	timeout time.Duration
	proxies *prometheus.Desc
}

// NewProxyCollector returns a collector for proxyfleet_proxies{phase}, read
// from src at every scrape (each read bounded by timeout; 0 means
// DefaultProxyScrapeTimeout). When src cannot be read (the cache is not
// started yet) the scrape carries no proxyfleet_proxies series rather than
// failing as a whole.
func NewProxyCollector(src ProxyPhases, timeout time.Duration) prometheus.Collector {
	if timeout <= 0 {
		timeout = DefaultProxyScrapeTimeout
	}
	return &proxyCollector{
		src:     src,
		timeout: timeout,
		proxies: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "proxies"),
			"Proxy objects by status.phase, read from the controller's cache at scrape time.", []string{"phase"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *proxyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.proxies }

// Collect implements prometheus.Collector.
func (c *proxyCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	counts, err := c.src.ProxiesByPhase(ctx)
	if err != nil {
		return
	}
	for phase, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.proxies, prometheus.GaugeValue, float64(n), phase)
	}
}
