package metrics

import prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

// PoolRecycles counts the Proxies ProxyPools recycled because too many
// sites banned them. It satisfies controller.RecycleRecorder.
type PoolRecycles struct {
	vec *prometheus.CounterVec
}

// NewPoolRecycles creates proxyfleet_pool_recycled_proxies_total and
// registers it with reg. It panics if reg already holds it (a wiring bug).
func NewPoolRecycles(reg prometheus.Registerer) *PoolRecycles {
	r := &PoolRecycles{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "pool_recycled_proxies_total",
		Help: "Proxies a ProxyPool drained to replace them because at least spec.recycle.bannedSites sites banned or rate-limited them within spec.recycle.window, by pool.",
	}, []string{"namespace", "pool"})}
	reg.MustRegister(r.vec)
	return r
}

// Recycled records one Proxy of pool namespace/name drained to recycle it.
func (r *PoolRecycles) Recycled(namespace, pool string) {
	r.vec.WithLabelValues(namespace, pool).Inc()
}
