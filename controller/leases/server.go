package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// DefaultShutdownGrace is how long in-flight lease requests may take when the
// manager stops.
const DefaultShutdownGrace = 5 * time.Second

// AuthDisabledWarning starts the log line written when the API runs without a
// token: loud, because anyone who reaches the port can lease upstreams.
// Upstreams with a login are then not offered: logins go only to
// authenticated callers.
const AuthDisabledWarning = "WARNING: lease API auth disabled"

// Options configure New and Setup.
type Options struct {
	// Listen is the host:port the API listens on. Required.
	Listen string
	// Cache is the cache whose Proxies are served; Setup takes the
	// manager's. Required for New.
	Cache cache.Cache
	// Token is the bearer token clients must send; empty (and no Reviewer)
	// turns authentication off, with a warning in the log.
	Token string
	// Reviewer, when set, also accepts projected service-account tokens
	// (see Reviewer); authentication is then on even without Token.
	Reviewer leaseapi.TokenReviewer
	// Tenancy is what a pod identity may lease: TenancyNamespaced (the
	// default, "") its own namespace's Proxies and those ProxyGrants share
	// with it, read from Cache; TenancyClusterWide every Proxy, as before
	// tenancy. Callers with the static Token lease every Proxy either way.
	Tenancy string
	// Store configures the lease store: TTLs, cooldowns, the per-member cap.
	Store pool.StoreOptions
	// Backend, when set, is the lease store to serve (a shared
	// *redisstore.RedisStore, already configured); nil makes an in-memory
	// pool.Store from Store. With a shared store every replica serves
	// the same leases and cooldowns.
	Backend pool.LeaseStore
	// Recorder counts POST /v1/leases by outcome; nil records nothing.
	Recorder leaseapi.LeaseRecorder
	// Credentials is the controller's credentials Secret cache, whose logins
	// lease answers carry; Setup takes the manager's (controller.NewManager's
	// Credentials()) when nil. Required for New.
	Credentials cache.Cache
	// Clock is the time source of the 409 log the ProxyPool autoscaler
	// reads (LastRefusal); nil is the real clock. The in-memory store keeps
	// its own, Store.Clock.
	Clock clock.PassiveClock
	// Logger receives the source's and the server's logs.
	Logger logr.Logger
	// ShutdownGrace bounds in-flight requests when the manager stops
	// (default DefaultShutdownGrace).
	ShutdownGrace time.Duration
	// Tracing, when set, gives every request but /healthz a server span
	// (tracing.Handler); nil adds nothing to the handler.
	Tracing trace.TracerProvider
	// HTTPTimeouts bound the server's connections (zero fields:
	// httpserver's defaults; tests shrink them).
	HTTPTimeouts httpserver.Timeouts
}

// API is the controller's lease API: the store, the Source feeding it from
// the Proxy cache, and the HTTP server. It is the server's manager Runnable.
type API struct {
	store  pool.LeaseStore
	source *Source
	ln     net.Listener
	srv    *http.Server
	token  bool
	grace  time.Duration
	// tenancy is what the start log says about who leases what.
	tenancy string
	log     logr.Logger

	// refusals remembers recent 409s for the ProxyPool autoscaler.
	refusals *refusalLog
}

// New checks o, creates the store and opens the listener (a busy port is
// an error before anything starts). The API and its Source (Runnables) must
// then run in a manager whose caches o.Cache and o.Credentials are; Setup
// does both.
func New(o Options) (*API, error) {
	switch {
	case o.Listen == "":
		return nil, errors.New("lease API: Options.Listen is required")
	case o.Cache == nil:
		return nil, errors.New("lease API: Options.Cache (the Proxy cache) is required")
	case o.Credentials == nil:
		return nil, errors.New("lease API: Options.Credentials (the credentials Secret cache) is required: build the manager with controller.NewManager or set it")
	case o.ShutdownGrace < 0:
		return nil, fmt.Errorf("lease API: Options.ShutdownGrace %s must not be negative", o.ShutdownGrace)
	case o.Tenancy != "" && o.Tenancy != TenancyNamespaced && o.Tenancy != TenancyClusterWide:
		return nil, fmt.Errorf("lease API: tenancy %q: want %s or %s", o.Tenancy, TenancyNamespaced, TenancyClusterWide)
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	log := o.Logger.WithName("leaseapi")
	if o.Logger.GetSink() == nil {
		log = logr.Discard()
	}
	store := o.Backend
	if store == nil {
		store = pool.NewStore(o.Store)
	}
	// Only authenticated callers are handed logins: without a token, Proxies
	// that have one are not offered at all.
	namespaced := o.Tenancy != TenancyClusterWide
	source := newSource(o.Cache, store, log, sourceOptions{Credentials: o.Credentials, WithholdLogins: o.Token == "" && o.Reviewer == nil, Grants: namespaced && o.Reviewer != nil})
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("lease API: cannot listen on %s: %w", o.Listen, err)
	}
	refusals := newRefusalLog(o.Clock)
	// Only a reviewed token names a namespace; under namespaced tenancy
	// its requests see the store through tenantStore. The refusal log sits
	// below it, so a 409 is remembered per scope tried, with the scope's
	// namespace (and pool) in its selector: the ProxyPool autoscaler then
	// grows a pool for the requests that could have used it, not for a
	// namespace it was never shared with.
	var served pool.LeaseStore = recordingBackend{LeaseStore: store, refusals: refusals}
	if source.grants {
		served = tenantStore{LeaseStore: served, grants: o.Cache, owners: &source.owners}
	}
	return &API{
		store:    store,
		source:   source,
		ln:       ln,
		token:    o.Token != "" || o.Reviewer != nil,
		grace:    o.ShutdownGrace,
		log:      log,
		refusals: refusals,
		tenancy:  tenancyOf(o),
		srv: httpserver.New(tracing.Handler(leaseapi.NewAPIServer(served, leaseapi.APIOptions{
			Token:    o.Token,
			Logger:   slog.New(logr.ToSlogHandler(log)),
			Recorder: o.Recorder,
			Reviewer: o.Reviewer,
			Pacer:    pacerOf(store),
			Tiers:    tiersOf(store),
			Quotas:   quotasOf(store),
		}), o.Tracing, "leaseapi"), slog.New(logr.ToSlogHandler(log)), o.HTTPTimeouts),
	}, nil
}

// Setup is New over mgr's caches (o.Cache and o.Credentials default to
// them), adding the Source and the server to mgr. Both run on every
// replica, leader or not.
func Setup(mgr manager.Manager, o Options) (*API, error) {
	if o.Cache == nil {
		o.Cache = mgr.GetCache()
	}
	if o.Credentials == nil {
		if m, ok := mgr.(interface{ Credentials() cache.Cache }); ok {
			o.Credentials = m.Credentials()
		}
	}
	a, err := New(o)
	if err != nil {
		return nil, err
	}
	for _, r := range a.Runnables() {
		if err := mgr.Add(r); err != nil {
			_ = a.ln.Close()
			return nil, fmt.Errorf("lease API: adding it to the manager: %w", err)
		}
	}
	return a, nil
}

// Runnables are what must run in the manager: the Source that feeds the
// store from the Proxy cache, then the server.
func (a *API) Runnables() []manager.Runnable { return []manager.Runnable{a.source, a} }

// Store is the lease store, for the scrape-time metrics collector.
func (a *API) Store() pool.LeaseStore { return a.store }

// Addr is the address the API listens on (the port chosen for ":0").
func (a *API) Addr() net.Addr { return a.ln.Addr() }

// NeedLeaderElection is false: every replica serves. With the in-memory
// store leases live in the replica that granted them (run one replica);
// with --lease-store redis://... every replica serves the same state.
func (a *API) NeedLeaderElection() bool { return false }

// Start serves the API once the Source has loaded the Proxies (requests
// wait in the listen backlog until then), sweeps the store, and stops
// gracefully when ctx ends.
func (a *API) Start(ctx context.Context) error {
	select {
	case <-a.source.Synced():
	case <-ctx.Done():
		_ = a.ln.Close()
		return nil
	}
	// The sweeper stops with Start, not only with ctx: when the server fails
	// on its own, Start must return its error while ctx still lives (the
	// manager cancels ctx only after a runnable has returned).
	sweepCtx, stopSweep := context.WithCancel(ctx)
	var sweep sync.WaitGroup
	sweep.Go(func() { a.store.Start(sweepCtx) })
	defer sweep.Wait()
	defer stopSweep()

	if !a.token {
		a.log.Info(AuthDisabledWarning+": no token file given; any client that reaches this port can lease upstreams (those with a login are withheld)",
			"addr", a.ln.Addr().String())
	}
	if a.tenancy == TenancyClusterWide {
		a.log.Info("WARNING: lease API tenancy cluster-wide: every pod identity the token review lets in may lease every namespace's Proxies; ProxyGrants are not read. Meant for migrating to namespaced tenancy (docs/tenancy.md)")
	}
	a.log.Info("lease API serving", "addr", a.ln.Addr().String(), "auth", a.token, "tenancy", a.tenancy)
	served := make(chan error, 1)
	go func() { served <- a.srv.Serve(a.ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("lease API on %s: %w", a.ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), a.grace)
	defer cancel()
	if err := a.srv.Shutdown(sctx); err != nil {
		_ = a.srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("lease API on %s: %w", a.ln.Addr(), err)
	}
	return nil
}

// tenancyOf is the tenancy o asks for, as the start log names it: only a
// reviewed token names a namespace, so without a Reviewer there is none.
func tenancyOf(o Options) string {
	switch {
	case o.Reviewer == nil:
		return "none (no token review)"
	case o.Tenancy == "":
		return TenancyNamespaced
	}
	return o.Tenancy
}

// pacerOf is the store's pace of sites (every lease store keeps one), so
// gateways on the lease API pace a site with the fleet; nil when a store
// keeps none.
// quotasOf is the store's keeping of token clients' quotas, for the
// --lease-api gateways that ask the API to keep them (nil: none).
func quotasOf(store pool.LeaseStore) pool.QuotaKeeper {
	q, _ := store.(pool.QuotaKeeper)
	return q
}

func pacerOf(store pool.LeaseStore) pool.SitePacer {
	p, _ := store.(pool.SitePacer)
	return p
}

// tiersOf is store's keeper of the sites' tiers, nil when it keeps none.
func tiersOf(store pool.LeaseStore) pool.SiteTierKeeper {
	k, _ := store.(pool.SiteTierKeeper)
	return k
}
