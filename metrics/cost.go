package metrics

import (
	"context"
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// ProxyPrice is the hourly price of one Managed Proxy's instance.
type ProxyPrice struct {
	Namespace, Name string
	// Provider is the providers config entry the Proxy runs on.
	Provider string
	// Price is the entry's configured price for an hour.
	Price float64
}

// ProxyPrices is what the price collector reads at every scrape: the price
// of every Managed Proxy that has an instance and whose provider entry
// gives a price. It must be safe for concurrent use.
type ProxyPrices interface {
	ProxyHourlyPrices(ctx context.Context) ([]ProxyPrice, error)
}

// priceCollector reads the prices at scrape time, as proxyCollector reads
// the phases, so a deleted Proxy's series goes with it.
type priceCollector struct {
	src     ProxyPrices
	timeout time.Duration
	desc    *prometheus.Desc
}

// NewProxyPriceCollector returns a collector for
// proxyfleet_proxy_hourly_price{namespace,proxy,provider}, read from src at
// every scrape (bounded by timeout; 0 means DefaultProxyScrapeTimeout).
// Summed, it is what the fleet costs an hour; a source that cannot be read
// yields no series rather than a failed scrape.
func NewProxyPriceCollector(src ProxyPrices, timeout time.Duration) prometheus.Collector {
	if timeout <= 0 {
		timeout = DefaultProxyScrapeTimeout
	}
	return &priceCollector{src: src, timeout: timeout,
		desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "proxy_hourly_price"),
			"Configured hourly price of each Managed Proxy's instance (its provider entry's hourlyPrice), for cost accounting.",
			[]string{"namespace", "proxy", "provider"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *priceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *priceCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	prices, err := c.src.ProxyHourlyPrices(ctx)
	if err != nil {
		return
	}
	for _, p := range prices {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, p.Price, p.Namespace, p.Name, p.Provider)
	}
}
