package manager

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/logging"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// Run connects to the cluster of cfg, builds the manager and everything it
// runs (the webhook, the providers, the Proxy reconciler with its health
// engine, the orphan GC and provider health monitor, the lease API, the
// status page, the ProxyPool reconciler) and serves until ctx ends. Every
// listener of its own is opened before the manager starts, so a busy port
// is an error naming its setting. The metrics go to controller-runtime's
// registry, which the manager's metrics server serves.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	stderr := logging.Locked(cfg.Stderr) // shared by the logger and the console trace exporter
	r := newRun(&cfg, processLogger(stderr, cfg.LogLevel, cfg.LogJSON), ctrlmetrics.Registry)
	tr, stopTracing, err := tracing.Start(ctx, "proxyfleet-controller", stderr, slog.New(logr.ToSlogHandler(r.log)))
	if err != nil {
		return err
	}
	defer stopTracing()
	r.tr = tr
	kube, err := r.kubeConfig()
	if err != nil {
		return err
	}
	mgr, err := controller.NewManager(kube, cfg.Manager)
	if err != nil {
		return err
	}
	if err := r.setup(ctx, mgr, kube); err != nil {
		return err
	}
	m := cfg.Manager
	r.log.Info("starting controller", "proxyNamespace", m.ProxyNamespace, "providers", len(r.provs),
		"leaderElect", m.LeaderElection, "metrics", m.MetricsAddr, "healthProbe", m.HealthProbeAddr)
	return mgr.Start(ctx)
}

// run is one run of the controller: what Run wires, in the order it is
// made.
type run struct {
	cfg *Config
	log logr.Logger
	reg prometheus.Registerer
	tr  *tracing.Tracing
	// requests is the status page's chart of lease request outcomes; the
	// lease API's recorder feeds it whether the page is served or not.
	requests *statuspage.Timeline
	provs    map[string]providers.Provider
}

// newRun is the run of cfg logging to log and registering its metrics
// with reg.
func newRun(cfg *Config, log logr.Logger, reg prometheus.Registerer) *run {
	cfg.Manager.Logger = log
	return &run{cfg: cfg, log: log, reg: reg, requests: statuspage.NewTimeline(statuspage.TimelineOptions{})}
}

// kubeConfig is the cluster config every client of the process is built
// from: rate-limited, traced (a span of the caller's only), and the
// webhook's NO_PROXY told the API server's addresses.
func (r *run) kubeConfig() (*rest.Config, error) {
	kube, err := restConfig(r.cfg.Kubeconfig, or(r.cfg.Names.Kubeconfig, "Kubeconfig"))
	if err != nil {
		return nil, err
	}
	r.cfg.limitAPIRequests(kube)
	r.cfg.Webhook.Config.APIServerHosts = apiServerHosts(kube)
	kube.Wrap(tracing.ParentOnlyTransport(r.tr.TracerProvider()))
	return kube, nil
}

// setup adds everything the manager runs. The webhook comes first, the
// providers before what uses them, the Proxy reconciler before the
// runnables that share its providers, the lease API before the status
// page and the ProxyPool reconciler that read its store.
func (r *run) setup(ctx context.Context, mgr ctrl.Manager, kube *rest.Config) error {
	if err := r.setupWebhook(mgr); err != nil {
		return err
	}
	provs, err := r.buildProviders(ctx, kube, mgr, metrics.NewProviderRequests(r.reg))
	if err != nil {
		return fmt.Errorf("%s %s: %w", or(r.cfg.Names.ProvidersConfig, "Providers"), r.cfg.Providers.File, err)
	}
	if r.provs = provs; provs == nil {
		r.log.Info("WARNING: no " + or(r.cfg.Names.ProvidersConfig, "Providers") + " given; only External Proxies will be served, Managed ones fail with ProviderNotConfigured")
	} else if err := r.resolveInstallation(ctx, mgr); err != nil {
		return err
	}
	if err := r.setupProxyReconciler(ctx, mgr); err != nil {
		return err
	}
	// Every replica exports the Proxy phases: each has the cache, leader or not.
	if err := registerProxyCollector(mgr, r.reg); err != nil {
		return err
	}
	if err := registerPriceCollector(mgr, r.reg, r.provs); err != nil {
		return err
	}
	if _, err := r.addRunnables(mgr); err != nil {
		return err
	}
	return r.setupLeasesAndPools(mgr)
}

// resolveInstallation reads the installation ID from the cluster when none
// was given: the reconciler stamps it on what it creates and the orphan GC
// deletes nothing else.
func (r *run) resolveInstallation(ctx context.Context, mgr ctrl.Manager) error {
	if r.cfg.Providers.Installation != "" {
		return nil
	}
	id, err := controller.InstallationID(ctx, mgr.GetAPIReader())
	if err != nil {
		return fmt.Errorf("%w; set %s", err, or(r.cfg.Names.Installation, "Providers.Installation"))
	}
	r.cfg.Providers.Installation = id
	r.log.Info("installation ID read from the cluster", "installation", id)
	return nil
}

// setupProxyReconciler sets up the Proxy reconciler with its health
// engine, whose events are one of its watches (so the engine comes first).
func (r *run) setupProxyReconciler(ctx context.Context, mgr ctrl.Manager) error {
	pr := &controller.ProxyReconciler{
		Client:                  mgr.GetClient(),
		Providers:               r.provs,
		Installation:            r.cfg.Providers.Installation,
		Intervals:               r.cfg.Intervals,
		MaxConcurrentReconciles: r.cfg.MaxConcurrentReconciles,
	}
	if _, err := r.setupHealth(mgr, pr); err != nil {
		return err
	}
	if err := pr.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the Proxy reconciler: %w", err)
	}
	return nil
}

// setupLeasesAndPools sets up the lease API (not leader-elected: every
// replica serves it), the status page, and the ProxyPool reconciler, which
// reads the API's leases.
func (r *run) setupLeasesAndPools(mgr ctrl.Manager) error {
	api, err := r.setupLeaseAPI(mgr)
	if err != nil {
		return err
	}
	if err := r.setupStatus(mgr, api); err != nil {
		return err
	}
	pr := &controller.ProxyPoolReconciler{Intervals: r.cfg.PoolIntervals, Recycles: metrics.NewPoolRecycles(r.reg)}
	if api != nil { // a nil *API in the interface would not read as "no lease store"
		pr.Leases, pr.Bans = api, api
	}
	if err := pr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyPool reconciler: %w", err)
	}
	// ProxyGrants are read by the lease API; their Resolved condition is
	// written by the leader, whether tenancy is namespaced or not, so an
	// owner preparing a migration sees what a grant names is there.
	if err := (&controller.ProxyGrantReconciler{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyGrant reconciler: %w", err)
	}
	return nil
}
