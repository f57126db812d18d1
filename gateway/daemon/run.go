package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/internal/logging"
	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// Run wires the store, member sources, prober, gateway, lease API and
// metrics server from cfg (in remote pool mode, cfg.PoolAPI, the lease API
// client instead of the store, sources, prober and API) and serves until ctx
// ends or SIGTERM/SIGINT arrives, then drains for up to cfg.ShutdownGrace
// and returns nil. Every listener is opened before anything starts, so a
// busy port is an error that leaves nothing running.
func Run(ctx context.Context, cfg Config) error {
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	if cfg.MITM != nil {
		defer cfg.MITM.CA.Close()
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	stderr := logging.Locked(cfg.Stderr) // shared by the logger and the console trace exporter
	r := &run{cfg: &cfg, stderr: stderr, log: logging.New(stderr, cfg.LogLevel, cfg.LogJSON), reg: prometheus.NewRegistry()}
	r.reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	// The status page's chart counts what the recorder counts.
	r.requests = statuspage.NewTimeline(statuspage.TimelineOptions{})
	r.rec = metrics.New(r.reg, r.requests)
	closePool, err := r.openPool()
	if err != nil {
		return err
	}
	defer closePool()
	tr, stopTracing, err := tracing.Start(ctx, "proxyfleet-gateway", stderr, r.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	r.tr = tr
	if err := r.build(); err != nil {
		return err
	}
	return r.serve(ctx, stopSignals)
}

// run is one run of the gateway: what Run wires, in the order it is made.
type run struct {
	cfg      *Config
	stderr   io.Writer
	log      *slog.Logger
	reg      *prometheus.Registry
	requests *statuspage.Timeline
	rec      *metrics.Metrics
	tr       *tracing.Tracing

	// The pool: the controller's lease API (remote, with its last-known
	// pool) in remote mode, else a store of the gateway's own.
	leases    pool.Pool
	store     pool.LeaseStore
	remote    *leaseapi.Client
	lastKnown *lastknown.Pool

	gw      *gateway.Gateway
	srv     *server
	members []pool.Member
}

// openPool opens what the gateway leases from (with its scrape-time
// gauges); the returned func closes it.
func (r *run) openPool() (func(), error) {
	cfg := r.cfg
	if cfg.PoolAPI != "" {
		r.remote, r.leases = cfg.PoolClient, cfg.PoolClient
		if cfg.OutageGrace > 0 {
			lk, err := newLastKnown(cfg, r.remote, r.reg, r.log.With("poolAPI", cfg.PoolAPI))
			if err != nil {
				return nil, err
			}
			r.lastKnown, r.leases = lk, lk
		}
		return func() {}, nil
	}
	store, closeStore, err := cfg.LeaseStore.Open(cfg.Store, r.log, r.reg)
	if err != nil {
		return nil, err
	}
	r.reg.MustRegister(metrics.NewPoolCollector(store), metrics.NewSiteCooldownCollector(store, 0))
	r.store, r.leases = store, store
	if _, inProcess := store.(*pool.Store); !inProcess && cfg.OutageGrace > 0 {
		// A shared store (Redis) may not answer for a while: ride it out.
		lk, err := rideOutStore(cfg, store, r.reg, r.log)
		if err != nil {
			closeStore()
			return nil, err
		}
		r.lastKnown, r.leases = lk, lk
	}
	return closeStore, nil
}

// build makes the gateway and the server that runs everything around it.
// The gateway is made before the members are known so that a reload can
// tell it which members left; the server's Reload is the upstreams file's
// OnChange (the file source runs only after srv is set).
func (r *run) build() error {
	cfg := r.cfg
	// The pace of sites is the lease store's (the in-process or Redis
	// store), or in remote mode the controller's, so that every gateway
	// on one store paces a site together.
	var (
		pacer  pool.SitePacer
		keeper pool.SiteTierKeeper
	)
	if r.remote != nil {
		pacer, keeper = r.remote, r.remote
	} else {
		pacer, _ = r.store.(pool.SitePacer)
		keeper, _ = r.store.(pool.SiteTierKeeper)
	}
	// Token clients' quotas live in the lease store: the one the gateway
	// holds, or the lease API's in remote mode.
	var quotaKeeper pool.QuotaKeeper
	if r.remote != nil {
		quotaKeeper = r.remote
	} else {
		quotaKeeper, _ = r.store.(pool.QuotaKeeper)
	}
	gw, err := gateway.New(gateway.Options{
		Pool:                r.leases,
		Pacer:               pacer,
		TierKeeper:          keeper,
		Mode:                cfg.Mode,
		LeaseTTL:            cfg.Store.DefaultTTL,
		Retries:             cfg.Retries,
		Classifier:          cfg.Classifier,
		Clients:             cfg.Clients,
		Quotas:              quotaKeeper,
		AllowPrivateTargets: cfg.AllowPrivateTargets,
		ClusterTargets:      cfg.ClusterTargets,
		DialTimeout:         cfg.DialTimeout,
		RequestTimeout:      cfg.RequestTimeout,
		MemberAnswerTimeout: cfg.AnswerTimeout,
		SiteAnswerTimeouts:  cfg.SiteTimeouts,
		Pacing:              cfg.Pacing,
		Tiers:               cfg.Tiers,
		BanBodyBytes:        cfg.BanBodyBytes,
		SiteRoots:           cfg.SiteRoots,
		MITM:                cfg.MITM,
		ConnectHTTPPorts:    cfg.ConnectHTTPPorts,
		AffinityEntries:     cfg.MaxSessions,
		FailureWindow:       cfg.Store.FailureWindow,
		Metrics:             r.rec,
		Logger:              r.log,
		Tracer:              NewGatewayTracer(r.tr.TracerProvider()),
	})
	if err != nil {
		return err
	}
	r.gw = gw
	r.reg.MustRegister(metrics.NewSitePaceCollector(gw, 0))
	srvOpts := serverOptions{Gateway: gw, Store: r.store, Remote: r.remote, RemoteURL: cfg.PoolAPI, LastKnown: r.lastKnown, Forget: r.rec, Logger: r.log}
	if r.store != nil {
		reload := func(next []pool.Member) { r.srv.Reload(next) }
		if r.members, srvOpts.Files, srvOpts.Prober, err = localPool(cfg, r.store, reload, r.rec, r.log); err != nil {
			return err
		}
	}
	r.srv, err = newServer(srvOpts)
	return err
}
