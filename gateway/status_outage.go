package gateway

import (
	"context"

	"github.com/proxyfleet/proxyfleet/statuspage"
)

// outageStatus is the status page's pool while the lease API is away: the
// last-known pool's members and cooldowns (its own leases and what it
// learnt included) and the outage's times. ok is false while the API
// answers, or without a last-known pool; the page then reads the API, and
// the snapshot returned carries only the last-known list's age and size.
func (s *Server) outageStatus(ctx context.Context) (statuspage.PoolSnapshot, bool) {
	if s.o.LastKnown == nil {
		return statuspage.PoolSnapshot{}, false
	}
	st := s.o.LastKnown.Status()
	lk := &statuspage.LastKnown{ListAt: st.ListAt, Members: st.Members}
	if !st.Down {
		return statuspage.PoolSnapshot{LastKnown: lk}, false
	}
	snap := statuspage.PoolSnapshot{LastKnown: lk, Outage: &statuspage.Outage{
		Since: st.Since, LastAnswer: st.LastAnswer, ListAt: st.ListAt, GraceEnds: st.GraceEnds,
		Refusing: st.Refusing, Untold: st.Untold,
	}}
	if !st.ListAt.IsZero() {
		snap.Members = s.o.LastKnown.Members()
		snap.Cooldowns, _ = s.o.LastKnown.ListCooldowns(ctx) // the local store never fails
	}
	return snap, true
}
