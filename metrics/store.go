package metrics

import (
	"errors"
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

	"github.com/proxyfleet/proxyfleet/pool"
)

// storeBuckets cover a shared lease store's round trip: a fraction of a
// millisecond on a quiet LAN, seconds while a call rides out a failover.
var storeBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// LeaseStoreCalls times the calls of a shared (Redis) lease store by
// operation and result; its Observe is redisstore.RedisOptions.Observe.
// The in-memory store has no round trip and is not timed.
type LeaseStoreCalls struct {
	vec *prometheus.HistogramVec
}

// NewLeaseStoreCalls registers proxyfleet_lease_store_call_duration_seconds
// with reg; it panics if reg already holds it (a wiring bug).
func NewLeaseStoreCalls(reg prometheus.Registerer) *LeaseStoreCalls {
	l := &LeaseStoreCalls{vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "lease_store", Name: "call_duration_seconds",
		Help:    "Round trips to the shared lease store (Redis) by operation (acquire, release, report, members, set_members, set_health, ping) and result (ok; unavailable: no answer, a failover, LOADING; error: a refusal or a bug), retries while it fails over included; the _count by result is the error rate.",
		Buckets: storeBuckets,
	}, []string{"op", "result"})}
	reg.MustRegister(l.vec)
	return l
}

// Observe records one call of op that took d and ended with err.
func (l *LeaseStoreCalls) Observe(op string, d time.Duration, err error) {
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, pool.ErrStoreUnavailable):
		result = "unavailable"
	default:
		result = "error"
	}
	l.vec.WithLabelValues(op, result).Observe(d.Seconds())
}
