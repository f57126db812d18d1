package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/health"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// Defaults of serverOptions' zero values.
const (
	// defaultRemoteMemberIdle is how long a --lease-api gateway keeps the
	// state and metric series of a member no request has taken; a member
	// still in the controller's pool is set up again on its next lease.
	defaultRemoteMemberIdle = 10 * time.Minute
	// poolAPICheckTimeout bounds the start-up check of the pool API.
	poolAPICheckTimeout = 5 * time.Second
)

// memberForgetter is optionally implemented by a Recorder that keeps
// per-member series: a member that left the pool takes its series along.
type memberForgetter interface {
	ForgetMember(name string)
}

// gatewayMembers is what the server asks of the gateway (*gateway.Gateway):
// to forget members that left the pool or that no request took for a
// while, and the episode of failure-rest overrides for the status page.
type gatewayMembers interface {
	ForgetMember(name string)
	ForgetIdleMembers(idle time.Duration) []string
	FailureRestOverrides() health.OverrideStatus
}

// serverOptions configures newServer: the gateway and the pool it runs
// with, either its own (Store, with an optional upstreams file and
// prober) or a controller's (Remote).
type serverOptions struct {
	// Gateway is required.
	Gateway gatewayMembers
	// Store is the gateway's own pool; its sweeps run with the server.
	Store pool.LeaseStore
	// Files reloads the members from the upstreams file; give it
	// server.Reload as its OnChange.
	Files *pool.FileSource
	// Prober decides the members' health.
	Prober *pool.Prober
	// Remote is the controller's lease API in --lease-api mode; Store,
	// Files and Prober are nil then.
	Remote *leaseapi.Client
	// RemoteURL is Remote's address, for the log (it never holds credentials).
	RemoteURL string
	// LastKnown is Remote's last-known pool, or a shared Store's (the
	// Gateway's Pool then), which the server runs and the status page
	// shows during an outage; nil for an in-process store, or when
	// --pool-outage-grace is 0.
	LastKnown *lastknown.Pool
	// RemoteIdle is defaultRemoteMemberIdle when zero.
	RemoteIdle time.Duration
	// Forget drops a removed member's metric series; may be nil.
	Forget memberForgetter
	// Logger gets reloads and the pool API's state; nil discards.
	Logger *slog.Logger
}

// server runs the work around a Gateway that is not a request: the member
// reloads (store, then gateway, then metrics), the sweeps and probes of an
// own pool, and in --lease-api mode the start-up check of the API and the
// forgetting of members no request has used for a while (the controller
// never says that a Proxy left). It is the process's, not the request
// path's: it calls the gateway only through gatewayMembers.
type server struct {
	o serverOptions
}

// newServer checks o and fills its defaults.
func newServer(o serverOptions) (*server, error) {
	if o.Gateway == nil {
		return nil, errors.New("gateway: the server needs its gateway")
	}
	if (o.Store == nil) == (o.Remote == nil) {
		return nil, errors.New("gateway: the server needs exactly one of Store and Remote")
	}
	if o.RemoteIdle <= 0 {
		o.RemoteIdle = defaultRemoteMemberIdle
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &server{o: o}, nil
}

// Reload replaces the own pool's members. SetMembers keeps live leases and
// tunnels (removed members are only never chosen again); then the gateway
// and the metrics forget the members that left.
func (s *server) Reload(next []pool.Member) {
	gone := removedMembers(s.o.Store.Members(), next)
	s.o.Store.SetMembers(next)
	for _, name := range gone {
		s.o.Gateway.ForgetMember(name)
		if s.o.Forget != nil {
			s.o.Forget.ForgetMember(name)
		}
	}
	s.o.Logger.Info("upstreams reloaded", "members", len(next), "removed", len(gone))
}

// Run does the background work until ctx ends and returns when all of it
// has stopped. Stop it only after the gateway drained, so probes and
// reloads keep the pool right for requests still in flight.
func (s *server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	goRun := func(run func(context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(ctx)
		}()
	}
	if s.o.Store != nil {
		goRun(s.o.Store.Start)
	}
	if s.o.Files != nil {
		goRun(s.o.Files.Run)
	}
	if s.o.Prober != nil {
		goRun(s.o.Prober.Run)
	}
	if s.o.Remote != nil {
		goRun(s.checkPoolAPI)
		goRun(s.forgetIdle)
	}
	if s.o.LastKnown != nil {
		goRun(s.o.LastKnown.Run)
	}
	wg.Wait()
}

// forgetIdle forgets, every quarter of RemoteIdle, the members no request
// took for RemoteIdle, with their series.
func (s *server) forgetIdle(ctx context.Context) {
	t := time.NewTicker(s.o.RemoteIdle / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, name := range s.o.Gateway.ForgetIdleMembers(s.o.RemoteIdle) {
				if s.o.Forget != nil {
					s.o.Forget.ForgetMember(name)
				}
			}
		}
	}
}

// checkPoolAPI asks the pool API once, at start, for its healthy upstreams
// and logs what an operator must know: unreachable (requests get 503 until
// it answers), the token refused, or nothing to lease. It never stops the
// gateway: a sidecar may well start before its controller.
func (s *server) checkPoolAPI(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, poolAPICheckTimeout)
	defer cancel()
	log, api := s.o.Logger, s.o.RemoteURL
	healthy, err := s.o.Remote.List(ctx, leaseapi.ListFilter{HealthyOnly: true})
	var apiErr *leaseapi.APIError
	switch {
	case err == nil && len(healthy) == 0:
		log.Warn("the lease API offers no healthy upstream yet; requests get 503 until it does", "poolAPI", api)
	case err == nil:
		log.Info("lease API reachable", "poolAPI", api, "healthyUpstreams", len(healthy))
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		log.Error("the lease API refused the token: check --pool-token-file; every request fails until it is fixed", "poolAPI", api, "err", err)
	case ctx.Err() != nil && !errors.Is(err, pool.ErrUnreachable):
		// Shutting down, or the check timed out on a reachable API.
		log.Warn("lease API check did not finish", "poolAPI", api, "err", err)
	default:
		log.Warn("lease API not reachable; requests that hold no lease get 503 pool_unreachable until it answers", "poolAPI", api, "err", err)
	}
}

// removedMembers names the members of current that next no longer has.
func removedMembers(current []pool.MemberStatus, next []pool.Member) []string {
	keep := make(map[string]bool, len(next))
	for _, m := range next {
		keep[m.Name] = true
	}
	var gone []string
	for _, m := range current {
		if !keep[m.Name] {
			gone = append(gone, m.Name)
		}
	}
	return gone
}

// statusReadTimeout bounds one read of the pool for the status page, so a
// slow lease store or API cannot hold page requests.
const statusReadTimeout = 5 * time.Second

// PoolStatus is what the gateway can see of its pool now, for the status
// page: its own store's members and cooldowns (with why each runs), or in
// --lease-api mode the lease API's member listing, whose cooldowns carry no
// reason. A read that fails is logged and shown as a fixed phrase, since
// store and API errors may name addresses the page does not show.
func (s *server) PoolStatus(ctx context.Context) statuspage.PoolSnapshot {
	snap := s.poolStatus(ctx)
	if o := s.o.Gateway.FailureRestOverrides(); !o.Since.IsZero() {
		snap.Overrides = &statuspage.Overrides{Since: o.Since, Last: o.Last, Count: o.Count, Member: o.Member, Over: o.Over}
	}
	return snap
}

// poolStatus is PoolStatus without the gateway's own override episode.
func (s *server) poolStatus(ctx context.Context) statuspage.PoolSnapshot {
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

// outageStatus is the status page's pool while the lease API is away: the
// last-known pool's members and cooldowns (its own leases and what it
// learnt included) and the outage's times. ok is false while the API
// answers, or without a last-known pool; the page then reads the API, and
// the snapshot returned carries only the last-known list's age and size.
func (s *server) outageStatus(ctx context.Context) (statuspage.PoolSnapshot, bool) {
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
