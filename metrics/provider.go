package metrics

import prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

// ProviderRequests counts provider calls made through providers.WithMetrics.
// It satisfies providers.RequestRecorder.
type ProviderRequests struct {
	vec *prometheus.CounterVec
}

// NewProviderRequests creates proxyfleet_provider_requests_total and
// registers it with reg. It panics if reg already holds it (a wiring bug).
func NewProviderRequests(reg prometheus.Registerer) *ProviderRequests {
	p := &ProviderRequests{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "provider_requests_total",
		Help: "Provider calls by provider entry, operation (create, get, delete, list) and result (ok, transient, permanent, quota_exceeded, not_found).",
	}, []string{"provider", "op", "result"})}
	reg.MustRegister(p.vec)
	return p
}

// ProviderRequest records one provider call.
func (p *ProviderRequests) ProviderRequest(provider, op, result string) {
	p.vec.WithLabelValues(provider, op, result).Inc()
}
