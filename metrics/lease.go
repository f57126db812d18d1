package metrics

import prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

// LeaseRequests counts lease API requests by outcome in a process that
// serves the API without being a gateway (the controller). It satisfies
// leaseapi.LeaseRecorder; a gateway uses Metrics.LeaseRequest instead.
type LeaseRequests struct {
	vec  *prometheus.CounterVec
	taps []OutcomeTap
}

// NewLeaseRequests creates proxyfleet_lease_requests_total and registers it
// with reg; taps (nil ones are ignored) also get every outcome. It panics
// if reg already holds it (a wiring bug).
func NewLeaseRequests(reg prometheus.Registerer, taps ...OutcomeTap) *LeaseRequests {
	l := &LeaseRequests{vec: newLeaseRequestsVec(), taps: nonNil(taps)}
	reg.MustRegister(l.vec)
	return l
}

// LeaseRequest records one POST /v1/leases by outcome (granted, no_match,
// invalid, error).
func (l *LeaseRequests) LeaseRequest(outcome string) {
	l.vec.WithLabelValues(outcome).Inc()
	for _, t := range l.taps {
		t.Add(outcome)
	}
}

// newLeaseRequestsVec is proxyfleet_lease_requests_total, shared by Metrics
// and LeaseRequests so the gateway and the controller export one definition.
func newLeaseRequestsVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "lease_requests_total",
		Help: "Lease API requests by outcome.",
	}, []string{"outcome"})
}
