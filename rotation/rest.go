package rotation

import "time"

// DefaultMaxFailureRestPercent is FailureRest.MaxPercent's default: at most
// half of the pool rests for its own failures at once. It is Envoy's panic
// threshold seen from the other side (below 50% healthy Envoy balances over
// every host) and about its max_ejection_percent: a failure that takes out
// more than half the fleet at once is almost never half the fleet breaking
// independently, but the network between the gateway and its members, or a
// rolling restart, which ends in seconds.
const DefaultMaxFailureRestPercent = 50

// FailureRest is the policy for the rests a member earns by its own
// failures (ResultUpstreamFailed: refused, reset, timed out, a failed
// handshake, broken for sites others reach). It never touches a ban or a
// site's rest ({member, target} cooldowns, or one for every target set by
// a ban report): those are about what a site wants, and no amount of
// member trouble makes a site want a banned member back.
//
// A failure rest is evidence that ages: the member failed then. Three rules
// keep stale evidence from emptying the pool:
//
//   - At most MaxPercent of the healthy members rest for their own failures
//     at once (Admit). A further failure still rests its member (the newest
//     evidence is the best), and the member that failed longest ago comes
//     back to make room: it is the one most likely to have recovered.
//   - When nothing else can serve a request, a member that rests for its
//     own failures is leased anyway, least recently failed first
//     (OverrideLess): a try that fails costs a retry, a refusal costs the
//     request.
//   - A member that answers (a request it carried, a passing probe, a
//     liveness check) ends its failure rest at once (ResultAnswered).
type FailureRest struct {
	// MaxPercent is the largest share, in percent (1..100), of the
	// healthy members that may rest for their own failures at once; 0 is
	// DefaultMaxFailureRestPercent, 100 lets every member rest (then
	// only the override keeps requests going).
	MaxPercent int
}

// percent is MaxPercent with the default applied and clamped to 1..100.
func (p FailureRest) percent() int {
	switch {
	case p.MaxPercent <= 0:
		return DefaultMaxFailureRestPercent
	case p.MaxPercent > 100:
		return 100
	}
	return p.MaxPercent
}

// Admit is what a member's new failure does when resting of members
// (healthy members, the failing one included; resting does not count the
// failing one) already rest for their own failures. The failing member
// always rests; evict says the least recently failed resting member must
// end its rest to keep the share at most MaxPercent. The rule is Envoy's
// (a host is ejected while the ejected share is below the maximum), so
// one member may always rest, even alone: the override then keeps it
// serving.
func (p FailureRest) Admit(resting, members int) (evict bool) {
	if resting <= 0 || members <= 0 {
		return false
	}
	return resting*100 >= p.percent()*members
}

// Rested is a member that rests for its own failures until Until, as a
// candidate for an override lease.
type Rested struct {
	Candidate
	// Until is when its failure rest ends. Every failure rest lasts one
	// window from the failure, so the earliest end is the least recent
	// failure.
	Until time.Time
}

// OverrideLess orders members resting for their own failures for an
// override lease, best first: least recently failed (earliest Until), then
// as Less. A member tried this way that fails again rests from that
// failure, so the next override goes to another: the overrides cycle
// through the resting members instead of hammering one.
func OverrideLess(a, b Rested) bool {
	if !a.Until.Equal(b.Until) {
		return a.Until.Before(b.Until)
	}
	return Less(a.Candidate, b.Candidate)
}
