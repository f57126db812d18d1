package metrics

import (
	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

	"github.com/proxyfleet/proxyfleet/pool"
)

// PoolState is what the scrape-time collector reads: the lease store (or
// anything else that knows the pool). It is called on every scrape, so it
// must be safe for concurrent use.
type PoolState interface {
	Members() []pool.MemberStatus
	ActiveLeases() int
	ActiveCooldowns() int
}

// poolCollector reads the pool at scrape time instead of keeping gauges that
// callers update: updated gauges drift and leak series, a read cannot.
type poolCollector struct {
	state     PoolState
	leases    *prometheus.Desc
	cooldowns *prometheus.Desc
	members   *prometheus.Desc
}

// NewPoolCollector returns a collector for proxyfleet_leases_active,
// proxyfleet_cooldowns_active and proxyfleet_members{healthy}, read from
// state at every scrape. Register it next to New's vectors.
func NewPoolCollector(state PoolState) prometheus.Collector {
	return &poolCollector{
		state: state,
		leases: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "leases_active"),
			"Unexpired leases in the pool.", nil, nil),
		cooldowns: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "cooldowns_active"),
			"Running cooldowns ({member, target} pairs and member-wide upstream-failure windows).", nil, nil),
		members: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "members"),
			"Pool members by whether they are in service: healthy by probe and not out for every target after an upstream failure.", []string{"healthy"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leases
	ch <- c.cooldowns
	ch <- c.members
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	healthy, unhealthy := 0, 0
	for _, m := range c.state.Members() {
		// A member inside its upstream-failure window is out of service
		// for every target, though its last probe passed: counting it
		// healthy would hide exactly the failures operators look for.
		if _, failing := m.Cooldowns[""]; m.Healthy && !failing {
			healthy++
		} else {
			unhealthy++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(c.state.ActiveLeases()))
	ch <- prometheus.MustNewConstMetric(c.cooldowns, prometheus.GaugeValue, float64(c.state.ActiveCooldowns()))
	ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(healthy), "true")
	ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(unhealthy), "false")
}
