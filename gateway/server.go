package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// Defaults of ServerOptions' zero values.
const (
	// DefaultRemoteMemberIdle is how long a --lease-api gateway keeps the
	// state and metric series of a member no request has taken; a member
	// still in the controller's pool is set up again on its next lease.
	DefaultRemoteMemberIdle = 10 * time.Minute
	// poolAPICheckTimeout bounds the start-up check of the pool API.
	poolAPICheckTimeout = 5 * time.Second
)

// MemberForgetter is optionally implemented by a Recorder that keeps
// per-member series: a member that left the pool takes its series along.
type MemberForgetter interface {
	ForgetMember(name string)
}

// ServerOptions configures NewServer: the gateway and the pool it runs
// with, either its own (Store, with an optional upstreams file and
// prober) or a controller's (Remote).
type ServerOptions struct {
	// Gateway is required.
	Gateway *Gateway
	// Store is the gateway's own pool; its sweeps run with the server.
	Store pool.LeaseStore
	// Files reloads the members from the upstreams file; give it
	// Server.Reload as its OnChange.
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
	// RemoteIdle is DefaultRemoteMemberIdle when zero.
	RemoteIdle time.Duration
	// Forget drops a removed member's metric series; may be nil.
	Forget MemberForgetter
	// Logger gets reloads and the pool API's state; nil discards.
	Logger *slog.Logger
}

// Server runs the work around a Gateway that is not a request: the member
// reloads (store, then gateway, then metrics), the sweeps and probes of an
// own pool, and in --lease-api mode the start-up check of the API and the
// forgetting of members no request has used for a while (the controller
// never says that a Proxy left). cmd/proxyfleet only wires it.
type Server struct {
	o ServerOptions
}

// NewServer checks o and fills its defaults.
func NewServer(o ServerOptions) (*Server, error) {
	if o.Gateway == nil {
		return nil, errors.New("gateway: ServerOptions.Gateway is required")
	}
	if (o.Store == nil) == (o.Remote == nil) {
		return nil, errors.New("gateway: ServerOptions needs exactly one of Store and Remote")
	}
	if o.RemoteIdle <= 0 {
		o.RemoteIdle = DefaultRemoteMemberIdle
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{o: o}, nil
}

// Reload replaces the own pool's members. SetMembers keeps live leases and
// tunnels (removed members are only never chosen again); then the gateway
// and the metrics forget the members that left.
func (s *Server) Reload(next []pool.Member) {
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
func (s *Server) Run(ctx context.Context) {
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
func (s *Server) forgetIdle(ctx context.Context) {
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
func (s *Server) checkPoolAPI(ctx context.Context) {
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
