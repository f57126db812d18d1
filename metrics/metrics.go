// Package metrics is proxyfleet's Prometheus instrumentation. Each package
// that records something defines the small recorder interface it needs;
// *Metrics satisfies them structurally, so only cmd/proxyfleet imports this
// package. Registration is explicit (no init, no default registry) so tests
// and several binaries in one process get independent registries.
package metrics

import (
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
)

// Namespace prefixes every proxyfleet series.
const Namespace = "proxyfleet"

// Metrics holds the fed vectors: counters and histograms that the gateway,
// the prober and the lease API update as things happen.
type Metrics struct {
	requests         *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	upstreamFailures *prometheus.CounterVec
	failureOverrides prometheus.Counter
	bytesRelayed     *prometheus.CounterVec
	// bytesUp and bytesDown are bytesRelayed's two series, resolved once:
	// BytesRelayed runs for every request and tunnel.
	bytesUp, bytesDown prometheus.Counter
	probeDuration      *prometheus.HistogramVec
	probeFailures      *prometheus.CounterVec
	leaseRequests      *prometheus.CounterVec
	// mitmHandshakes{leg, resumed}: the four series, resolved once.
	mitmHandshakes *prometheus.CounterVec
	handshakes     [2][2]prometheus.Counter
	// helloFallbacks{reason}: tunnels whose site connections sent a preset
	// instead of the client's hello.
	helloFallbacks *prometheus.CounterVec
	// taps also get every request's outcome (the status page's chart).
	taps []OutcomeTap
}

// OutcomeTap receives every outcome a recorder counts, as it is counted:
// the status pages' Timeline. Add runs on the request path and must be cheap.
type OutcomeTap interface {
	Add(outcome string)
}

// nonNil drops nil taps, so callers can pass an optional one as it is.
func nonNil(taps []OutcomeTap) []OutcomeTap {
	var out []OutcomeTap
	for _, t := range taps {
		if t != nil {
			out = append(out, t)
		}
	}
	return out
}

// requestBuckets reach into minutes because a CONNECT tunnel's duration is
// the life of the tunnel, not one round trip.
var requestBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// probeBuckets cover a probe through a proxy, bounded by the probe timeout.
var probeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New creates the fed vectors and registers them with reg; taps (nil ones
// are ignored) also get every Request's outcome. It panics if reg already
// holds them: registering twice is a wiring bug, not a runtime condition.
func New(reg prometheus.Registerer, taps ...OutcomeTap) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "requests_total",
			Help: "Client requests and CONNECT tunnels handled by the gateway, by the member that served them and the outcome.",
		}, []string{"member", "outcome"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "request_duration_seconds",
			Help:    "Time from receiving a client request to finishing its answer (for CONNECT: the life of the tunnel), by outcome.",
			Buckets: requestBuckets,
		}, []string{"outcome"}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "upstream_failures_total",
			Help: "Member-wide upstream failures (refused, reset, timed out, TLS or SOCKS5 handshake, 407, broken for sites other members reach), by member; an answer that a site is unreachable is none.",
		}, []string{"member"}),
		failureOverrides: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "failure_rest_overrides_total",
			Help: "Leases of members resting for their own failures, taken because every member that could serve the request rested so (the least recently failed is tried anyway).",
		}),
		bytesRelayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "bytes_relayed_total",
			Help: "Bytes relayed between clients and upstreams, by direction (up: client to target; down: target to client).",
		}, []string{"direction"}),
		probeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "probe_duration_seconds",
			Help:    "Duration of every health probe through a member, successful or not.",
			Buckets: probeBuckets,
		}, []string{"member"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "probe_failures_total",
			Help: "Failed health probes through a member.",
		}, []string{"member"}),
		leaseRequests: newLeaseRequestsVec(),
		mitmHandshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "mitm_handshakes_total",
			Help: "Completed TLS handshakes of intercepted tunnels, by leg (client: the client's with the gateway; site: the gateway's with the site under --mitm-fingerprint mirror) and whether they resumed a session.",
		}, []string{"leg", "resumed"}),
		helloFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "gateway", Name: "mitm_hello_fallbacks_total",
			Help: "MITM tunnels whose site connections sent a browser preset instead of the client's mirrored ClientHello, by reason (unmirrorable: the hello cannot be mirrored; otherwise what the gateway's TLS library could not complete with the site: build, key_share, group, cipher_suite, signature, version, extension, other).",
		}, []string{"reason"}),
		taps: nonNil(taps),
	}
	m.bytesUp, m.bytesDown = m.bytesRelayed.WithLabelValues("up"), m.bytesRelayed.WithLabelValues("down")
	for i, leg := range []string{"client", "site"} {
		for j, resumed := range []string{"false", "true"} {
			m.handshakes[i][j] = m.mitmHandshakes.WithLabelValues(leg, resumed)
		}
	}
	reg.MustRegister(m.requests, m.requestDuration, m.upstreamFailures, m.failureOverrides, m.bytesRelayed,
		m.probeDuration, m.probeFailures, m.leaseRequests, m.mitmHandshakes, m.helloFallbacks)
	return m
}

// MITMHandshake counts one completed TLS handshake of an intercepted
// tunnel on leg ("client" or "site") and whether it resumed a session.
func (m *Metrics) MITMHandshake(leg string, resumed bool) {
	i, j := 0, 0
	if leg == "site" {
		i = 1
	}
	if resumed {
		j = 1
	}
	m.handshakes[i][j].Inc()
}

// MITMHelloFallback counts one tunnel that fell back from its client's
// ClientHello to a preset, by reason.
func (m *Metrics) MITMHelloFallback(reason string) {
	m.helloFallbacks.WithLabelValues(reason).Inc()
}

// Request records one finished client request or tunnel: which member served
// it (empty when none could be leased), its outcome and how long it took.
func (m *Metrics) Request(member, outcome string, d time.Duration) {
	m.requests.WithLabelValues(member, outcome).Inc()
	m.requestDuration.WithLabelValues(outcome).Observe(d.Seconds())
	for _, t := range m.taps {
		t.Add(outcome)
	}
}

// UpstreamFailure records that member itself failed (as opposed to the site
// answering with a ban).
func (m *Metrics) UpstreamFailure(member string) {
	m.upstreamFailures.WithLabelValues(member).Inc()
}

// FailureRestOverride counts one lease of a member resting for its own
// failures, taken because no other member could serve.
func (m *Metrics) FailureRestOverride() { m.failureOverrides.Inc() }

// BytesRelayed adds n bytes relayed in direction ("up": client to target,
// "down": target to client). Non-positive n is ignored, so callers can pass a copy's
// count unconditionally.
func (m *Metrics) BytesRelayed(direction string, n int64) {
	if n <= 0 {
		return
	}
	switch direction {
	case "up":
		m.bytesUp.Add(float64(n))
	case "down":
		m.bytesDown.Add(float64(n))
	default:
		m.bytesRelayed.WithLabelValues(direction).Add(float64(n))
	}
}

// ObserveProbe records one health probe through member: its duration always,
// and a failure when ok is false.
func (m *Metrics) ObserveProbe(member string, d time.Duration, ok bool) {
	m.probeDuration.WithLabelValues(member).Observe(d.Seconds())
	if !ok {
		m.probeFailures.WithLabelValues(member).Inc()
	} else {
		// Touch the counter so a healthy member shows an explicit zero,
		// which is what failure-ratio alerts divide by.
		m.probeFailures.WithLabelValues(member)
	}
}

// ForgetProbe deletes a member's probe series; the prober calls it when it
// prunes a member that left the pool.
func (m *Metrics) ForgetProbe(member string) {
	l := prometheus.Labels{"member": member}
	m.probeDuration.DeletePartialMatch(l)
	m.probeFailures.DeletePartialMatch(l)
}

// ForgetMember deletes every series labelled with member, so members removed
// from the pool (an upstreams file edit) do not linger in scrapes forever.
func (m *Metrics) ForgetMember(member string) {
	l := prometheus.Labels{"member": member}
	m.requests.DeletePartialMatch(l)
	m.upstreamFailures.DeletePartialMatch(l)
	m.ForgetProbe(member)
}

// LeaseRequest records one lease API request by outcome (for example
// "granted", "no_match", "bad_request", "unauthorized").
func (m *Metrics) LeaseRequest(outcome string) {
	m.leaseRequests.WithLabelValues(outcome).Inc()
}
