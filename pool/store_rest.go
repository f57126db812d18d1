package pool

import (
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// The store's side of rotation.FailureRest: how much of the pool may rest
// for its own failures at once, leasing such a member when nothing else
// can serve, and ending the rest of a member that answered. Only a
// cooldown for every target whose reason is upstream_failed is a failure
// rest; a ban (for one site, or reported for every target) and a site's
// rest are never shortened here.

// failureResting reports whether ms rests for its own failures at now.
func (ms *memberState) failureResting(now time.Time) bool {
	c := ms.cool[""]
	return c != nil && c.reason == rotation.ResultUpstreamFailed && now.Before(c.until)
}

// admitFailureRest makes room for ms's new failure rest: when the healthy
// members already resting for their own failures are the share the policy
// allows, the one that failed longest ago ends its rest. It scans the
// members (a failure is rare beside a lease); s.mu is held.
func (s *Store) admitFailureRest(ms *memberState, now time.Time) {
	healthy := 0
	var oldest *memberState
	resting := 0
	for _, o := range s.order {
		if !o.healthy {
			continue
		}
		healthy++
		if o == ms || !o.failureResting(now) {
			continue
		}
		resting++
		if oldest == nil || rotation.OverrideLess(o.rested(), oldest.rested()) {
			oldest = o
		}
	}
	if oldest != nil && s.o.FailureRest.Admit(resting, healthy) {
		s.endFailureRest(oldest, now)
	}
}

// rested is ms as an override candidate.
func (ms *memberState) rested() rotation.Rested {
	r := rotation.Rested{Candidate: ms.key}
	if c := ms.cool[""]; c != nil {
		r.Until = c.until
	}
	return r
}

// endFailureRest ends ms's rest for its own failures, if it has one, and
// puts it back in the index. A ban or site rest is left as it is.
func (s *Store) endFailureRest(ms *memberState, now time.Time) {
	if !ms.failureResting(now) {
		return
	}
	ms.cool[""].until = now
	// Its entry in s.resting, if any, stays until it comes due: place
	// then finds the member indexed and leaves it.
	s.place(ms, now)
}

// override picks the member to lease when none is eligible for req: among
// the members that would be but for a rest for their own failures, the
// least recently failed (rotation.OverrideLess). Nil when there is none:
// an unhealthy member, one banned or resting for the target, or one at
// capacity is never overridden. Members resting for every target are
// exactly those outside the index, so only they are looked at.
func (s *Store) override(req AcquireRequest, now time.Time) *memberState {
	var best *memberState
	consider := func(ms *memberState) {
		if !ms.current || !ms.failureResting(now) || !s.overridable(ms, req, now) {
			return
		}
		if best == nil || rotation.OverrideLess(ms.rested(), best.rested()) {
			best = ms
		}
	}
	if req.Proxy != "" {
		if ms := s.members[req.Proxy]; ms != nil {
			consider(ms)
		}
		return best
	}
	for _, e := range s.resting {
		consider(e.ms)
	}
	return best
}

// overridable is judge without the failure rest: selected, healthy, not
// resting for req's target, below capacity.
func (s *Store) overridable(ms *memberState, req AcquireRequest, now time.Time) bool {
	if !MatchSelector(ms.m.Attributes, req.Selector) || !ms.healthy {
		return false
	}
	if req.Target != "" {
		if c := ms.cool[req.Target]; c != nil && now.Before(c.until) {
			return false
		}
	}
	return s.o.MaxLeasesPerMember <= 0 || ms.key.Active < s.o.MaxLeasesPerMember
}

// Answered records that the member of that name answered outside any
// lease (a passing probe): its rest for its own failures ends. Unknown
// names are ignored, as in SetHealth.
func (s *Store) Answered(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ms := s.members[name]; ms != nil {
		now := s.o.Clock.Now()
		s.advance(now)
		s.endFailureRest(ms, now)
	}
}
