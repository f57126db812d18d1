package metrics

import prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

// PoolOutages counts the outages of the pool a gateway leases from when
// that pool is remote (a --lease-api lease API or a Redis --lease-store) and
// the leases it granted itself from its last-known pool meanwhile; it
// implements lastknown.Recorder.
type PoolOutages struct {
	outages prometheus.Counter
	leases  prometheus.Counter
}

// NewPoolOutages registers proxyfleet_gateway_pool_outages_total and
// proxyfleet_gateway_pool_last_known_leases_total with reg, and
// proxyfleet_gateway_pool_outage, read from down at every scrape (1 while
// the lease API or store is away, 2 while requests are refused because the outage
// outlasted the grace or no member list was ever received).
func NewPoolOutages(reg prometheus.Registerer, down func() (away, refusing bool)) *PoolOutages {
	p := &PoolOutages{
		outages: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "pool_outages_total",
			Help: "Outages of the pool the gateway leases from, the --lease-api lease API (no answer, or a 5xx) or a Redis --lease-store (no answer), counted once each when they begin.",
		}),
		leases: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "pool_last_known_leases_total",
			Help: "Leases the gateway granted itself from its last-known members while the lease API or store was away.",
		}),
	}
	state := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "pool_outage",
		Help: "0 while the lease API or store answers, 1 while it is away and the gateway leases from its last-known members, 2 while it refuses requests (beyond --pool-outage-grace, or no member list ever received).",
	}, func() float64 {
		switch away, refusing := down(); {
		case refusing:
			return 2
		case away:
			return 1
		}
		return 0
	})
	reg.MustRegister(p.outages, p.leases, state)
	return p
}

// PoolOutage counts an outage that began.
func (p *PoolOutages) PoolOutage() { p.outages.Inc() }

// LastKnownLease counts a lease granted from the last-known members.
func (p *PoolOutages) LastKnownLease() { p.leases.Inc() }
