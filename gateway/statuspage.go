package gateway

import (
	"context"
	"time"

	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// statusReadTimeout bounds one read of the pool for the status page, so a
// slow lease store or API cannot hold page requests.
const statusReadTimeout = 5 * time.Second

// PoolStatus is what the gateway can see of its pool now, for the status
// page: its own store's members and cooldowns (with why each runs), or in
// --lease-api mode the lease API's member listing, whose cooldowns carry no
// reason. A read that fails is logged and shown as a fixed phrase, since
// store and API errors may name addresses the page does not show.
func (s *Server) PoolStatus(ctx context.Context) statuspage.PoolSnapshot {
	snap := s.poolStatus(ctx)
	if o := s.o.Gateway.FailureRestOverrides(); !o.Since.IsZero() {
		snap.Overrides = &statuspage.Overrides{Since: o.Since, Last: o.Last, Count: o.Count, Member: o.Member, Over: o.Over}
	}
	return snap
}

// poolStatus is PoolStatus without the gateway's own override episode.
func (s *Server) poolStatus(ctx context.Context) statuspage.PoolSnapshot {
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	lk, down := s.outageStatus(ctx)
	if down {
		return lk
	}
	if s.o.Remote != nil {
		list, err := s.o.Remote.List(ctx, leaseapi.ListFilter{})
		if err != nil {
			s.o.Logger.Warn("status page: listing the lease API's members failed", "poolAPI", s.o.RemoteURL, "err", err)
			return statuspage.PoolSnapshot{Err: "the lease API could not be read (see the gateway's log)", LastKnown: lk.LastKnown}
		}
		ms, cs := statuspage.MembersFromAPI(list)
		return statuspage.PoolSnapshot{Members: ms, Cooldowns: cs, LastKnown: lk.LastKnown}
	}
	var snap statuspage.PoolSnapshot
	ms, err := s.o.Store.ListMembers(ctx)
	if err == nil {
		snap.Members = ms
		snap.Cooldowns, err = s.o.Store.ListCooldowns(ctx)
	}
	if err != nil {
		s.o.Logger.Warn("status page: reading the lease store failed", "err", err)
		snap.Err = "the lease store could not be read (see the gateway's log)"
	}
	return snap
}
