// Package probe is the one health probe of proxyfleet and its one threshold
// counter. The gateway's prober (pool) probes its members with it, the
// controller's health engine (controller/health) its Proxies; both fetch a
// URL through the proxy itself with Fetch and turn the results into a
// verdict with Counter, so the two agree on what a probe is and when a
// verdict flips.
//
// It imports the standard library only; nothing of
// proxyfleet.
package probe

// Counter turns consecutive probe results into a verdict. The first result
// sets the verdict at once (a new proxy does not wait out a threshold to be
// used); after that a healthy proxy turns unhealthy only after
// failureThreshold failures in a row, an unhealthy one healthy only after
// successThreshold successes in a row, and a result of the other kind
// restarts the count. The zero Counter has no verdict.
type Counter struct {
	known, healthy bool
	okRun, failRun int
}

// Seeded is a Counter that starts from a verdict known elsewhere (a leader
// handover reads it from status) with both runs at zero.
func Seeded(healthy bool) Counter {
	return Counter{known: true, healthy: healthy}
}

// Observe counts one result and moves the verdict. Thresholds below one
// count as one.
func (c *Counter) Observe(ok bool, successThreshold, failureThreshold int) {
	if ok {
		c.okRun++
		c.failRun = 0
	} else {
		c.failRun++
		c.okRun = 0
	}
	switch {
	case !c.known:
		c.known, c.healthy = true, ok
	case !c.healthy && ok && c.okRun >= successThreshold:
		c.healthy = true
	case c.healthy && !ok && c.failRun >= failureThreshold:
		c.healthy = false
	}
}

// Verdict is the current verdict, and whether there is one yet.
func (c *Counter) Verdict() (healthy, known bool) { return c.healthy, c.known }
