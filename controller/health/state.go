package health

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/probe"
)

// minLatencyChange is the floor of a reportable latency change: below it a
// change is noise on any network.
const minLatencyChange = 20 * time.Millisecond

// result is the outcome of one probe.
type result struct {
	ok      bool
	err     error
	latency time.Duration
	at      time.Time // when the probe started
	msg     string    // the Healthy condition's message for this result
}

// state is the engine's knowledge of one Proxy at one address. All fields
// are guarded by Engine.mu.
type state struct {
	addr   string               // host:port this state belongs to
	probed bool                 // a probe URL is configured
	hc     v1alpha1.HealthCheck // defaulted, refreshed every tick

	next     time.Time // when the next probe is due
	inFlight bool      // a probe was dispatched and has not been recorded

	// verdict counts consecutive results and holds the verdict after the
	// thresholds (the same counter as the gateway's prober).
	verdict probe.Counter

	// rep is the reported view (what the last emitted event published and
	// Snapshot returns); reportedAt is when its probe ran, untruncated, for
	// the rate limit. They advance only when an event was sent.
	rep        Verdict
	reportedAt time.Time

	// clearSent records that a "drop the stale verdict" event went out.
	clearSent bool
}

// newState starts tracking p at addr. With seed, a True or False Healthy
// condition in p's status becomes the verdict (a leader handover: verdict
// kept, counters zeroed, the first probe jittered across the interval so a
// restarted controller does not probe the whole fleet at once). Without a
// usable condition the proxy is probed on the next tick.
func newState(p *v1alpha1.Proxy, addr string, probed bool, now time.Time, seed bool, jitter func(time.Duration) time.Duration) *state {
	st := &state{addr: addr, probed: probed, hc: p.Spec.HealthCheck.WithDefaults(), next: now}
	if !seed || !probed {
		return st
	}
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
	if c == nil || c.Status == metav1.ConditionUnknown {
		return st
	}
	healthy := c.Status == metav1.ConditionTrue
	st.verdict = probe.Seeded(healthy)
	st.rep = Verdict{Known: true, Healthy: healthy, Message: c.Message}
	if healthy {
		st.rep.Latency = time.Duration(p.Status.LatencyMillis) * time.Millisecond
	}
	if t := p.Status.LastHealthCheckTime; t != nil {
		st.rep.CheckedAt = t.Time
		st.reportedAt = t.Time
	}
	st.next = now.Add(jitter(st.hc.Interval()))
	return st
}

// observe counts r and moves the verdict, and returns the verdict to report
// and whether it is status-affecting:
//
//   - the first-ever verdict comes from the first probe;
//   - after that the verdict flips to healthy only after successThreshold
//     successes in a row, to unhealthy only after failureThreshold failures;
//   - a healthy proxy whose latency moved by more than max(20ms, 50% of the
//     reported latency) is reported again, at most once per minReport.
//
// Nothing else is reported: a failure below the threshold, a success of a
// proxy still reported unhealthy, small latency changes.
func (st *state) observe(r result, minReport time.Duration) (Verdict, bool) {
	hc := st.hc.WithDefaults()
	st.verdict.Observe(r.ok, int(hc.SuccessThreshold), int(hc.FailureThreshold))
	healthy, _ := st.verdict.Verdict()
	v := Verdict{Known: true, Healthy: healthy, Message: r.msg, CheckedAt: r.at.Truncate(time.Second)}
	if healthy {
		v.Latency = r.latency
	}
	switch {
	case !st.rep.Known || st.rep.Healthy != healthy:
		// The first verdict, or a flip (or one whose event was dropped).
		return v, true
	case healthy && r.ok && latencyChanged(st.rep.Latency, r.latency) &&
		r.at.Sub(st.reportedAt) >= minReport:
		return v, true
	}
	return Verdict{}, false
}

// report advances the reported markers once the event for v was sent.
func (st *state) report(v Verdict, at time.Time) {
	st.rep = v
	st.reportedAt = at
}

// latencyChanged reports a change from the reported latency larger than
// max(20ms, 50% of it): a bare percentage is undefined at zero and lets a
// proxy jittering between 40ms and 61ms report forever.
func latencyChanged(reported, now time.Duration) bool {
	d := now - reported
	if d < 0 {
		d = -d
	}
	return d > max(minLatencyChange, reported/2)
}
