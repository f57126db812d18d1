package metrics

import prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

// OrphanDeletions counts what the orphan GC removed. It satisfies
// gc.Recorder.
type OrphanDeletions struct {
	vec *prometheus.CounterVec
}

// NewOrphanDeletions creates proxyfleet_gc_orphans_deleted_total and
// registers it with reg. It panics if reg already holds it (a wiring bug).
func NewOrphanDeletions(reg prometheus.Registerer) *OrphanDeletions {
	o := &OrphanDeletions{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "gc_orphans_deleted_total",
		Help: "Backend objects the orphan GC removed because no Proxy owns them, by provider entry and kind (pod, vm, domain, overlay, seed, mark).",
	}, []string{"provider", "kind"})}
	reg.MustRegister(o.vec)
	return o
}

// OrphanDeleted records one removed object.
func (o *OrphanDeletions) OrphanDeleted(provider, kind string) {
	o.vec.WithLabelValues(provider, kind).Inc()
}
