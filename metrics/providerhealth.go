package metrics

import (
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// ProviderChecks is what the provider health collector reads at every
// scrape: the latest check of every provider target. The controller's
// provider health monitor satisfies it; on a replica that is not the leader
// it holds nothing, so only the leader exports these series.
type ProviderChecks interface {
	EachTarget(fn func(provider, target string, up bool, duration time.Duration, checkedAt time.Time))
}

// providerHealthCollector turns the monitor's snapshot into gauges at scrape
// time, so targets that disappear leave no stale series behind.
type providerHealthCollector struct {
	src       ProviderChecks
	up        *prometheus.Desc
	duration  *prometheus.Desc
	timestamp *prometheus.Desc
}

// NewProviderHealthCollector returns a collector for
// proxyfleet_provider_target_up, proxyfleet_provider_check_duration_seconds
// and proxyfleet_provider_check_timestamp_seconds, each labelled
// {provider,target} and read from src at every scrape.
func NewProviderHealthCollector(src ProviderChecks) prometheus.Collector {
	labels := []string{"provider", "target"}
	return &providerHealthCollector{
		src: src,
		up: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "provider", "target_up"),
			"1 when the latest check found the provider target usable, else 0.", labels, nil),
		duration: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "provider", "check_duration_seconds"),
			"How long the latest check of the provider took (the timeout when it did not return).", labels, nil),
		timestamp: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "provider", "check_timestamp_seconds"),
			"Unix time the latest check of the provider finished; alert when it stops moving.", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *providerHealthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.duration
	ch <- c.timestamp
}

// Collect implements prometheus.Collector.
func (c *providerHealthCollector) Collect(ch chan<- prometheus.Metric) {
	c.src.EachTarget(func(provider, target string, up bool, d time.Duration, at time.Time) {
		v := 0.0
		if up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, v, provider, target)
		ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, d.Seconds(), provider, target)
		ch <- prometheus.MustNewConstMetric(c.timestamp, prometheus.GaugeValue, float64(at.UnixNano())/1e9, provider, target)
	})
}
