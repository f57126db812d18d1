//go:build !sidecar

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/logging"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/providers"
)

// Flags of the controller process itself; each group of parts (runnables,
// health engine, lease API, webhook) names its own beside its parser.
// --metrics-listen, --log-level, --log-format and --config share the
// gateway's names and constants.
const (
	flagKubeconfig              = "kubeconfig"
	flagProvidersConfig         = "providers-config"
	flagLeaderElect             = "leader-elect"
	flagLeaderElectionNamespace = "leader-election-namespace"
	flagHealthProbeListen       = "health-probe-listen"
	flagProxyNamespace          = "proxy-namespace"
	flagMaxConcurrentReconciles = "max-concurrent-reconciles"
	flagRequeueNow              = "requeue-now"
	flagProvisioningPoll        = "provisioning-poll"
	flagDeletionPoll            = "deletion-poll"
	flagDriftPoll               = "drift-poll"
	flagQuotaRetry              = "quota-retry"
	flagPoolDrainPoll           = "pool-drain-poll"
	flagAutoscaleInterval       = "autoscale-interval"
	flagRecycleInterval         = "recycle-interval"
	flagKubeAPIQPS              = "kube-api-qps"
	flagKubeAPIBurst            = "kube-api-burst"
)

// Defaults of --kube-api-qps and --kube-api-burst: the client-side rate
// limit of every request the controller makes to the API server. client-go's
// own default (5 per second, bursts of 10) made a fleet of 1,000 Proxies,
// two status writes each on the way to Ready, take more than five minutes
// to come up; 50 per second lets the same fleet's 2,000 writes through in
// 40 seconds, and a burst of 100 absorbs a kubectl scale without queueing.
// They are kube-scheduler's defaults, a controller that also writes one
// status per object it places. The API server's priority and fairness still
// protects it: a 429 it answers is retried by client-go after its
// Retry-After, through this same limiter, never at once.
const (
	defaultKubeAPIQPS   = 50
	defaultKubeAPIBurst = 100
)

// controllerCommands is the controller subcommand; the sidecar build
// (sidecar.go) has none.
func controllerCommands() []*cli.Command { return []*cli.Command{controllerCommand()} }

// controllerCommand is `proxyfleet controller`: the manager that keeps the
// Proxy fleet alive. Like the gateway, every flag also reads
// PROXYFLEET_<FLAG_NAME> and its key in the --config file.
func controllerCommand() *cli.Command {
	flags := controllerFlags()
	return &cli.Command{
		Name:  "controller",
		Usage: "reconcile Proxy objects: create, replace and delete upstream proxies through the configured providers",
		Description: "Runs the Kubernetes controller. Without --providers-config only External Proxies are served;\n" +
			"Managed ones fail with a condition saying so. It writes no files (a read-only root filesystem is fine).\n" +
			"Every flag can also be set with the environment variable shown, or as a key (the flag name without\n" +
			"dashes) in the YAML file given by --config; a flag beats the environment, which beats the file,\n" +
			"which beats the default.",
		Flags:        flags,
		Before:       initConfigFile(flagConfig, flags),
		OnUsageError: usageError("controller"),
		Action:       runController,
	}
}

// controllerFlags are every flag of `proxyfleet controller`: its own, then
// each part's group.
func controllerFlags() []cli.Flag {
	d := controller.DefaultIntervals()
	pd := controller.DefaultPoolIntervals()
	return append([]cli.Flag{
		configFileFlag(),
		pathFlag(flagKubeconfig, "kubeconfig `FILE` (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)"),
		pathFlag(flagProvidersConfig, "providers config `FILE` (YAML); without it Managed Proxies cannot be served"),
		boolFlag(flagLeaderElect, "elect one active replica through a Lease"),
		stringFlag(flagLeaderElectionNamespace, "", "`NAMESPACE` of the leader-election Lease (default: the pod's namespace, else --proxy-namespace)"),
		stringFlag(flagMetricsListen, ":8080", "`ADDR` serving Prometheus /metrics; 0 turns it off"),
		stringFlag(flagHealthProbeListen, ":8081", "`ADDR` serving /healthz and /readyz; 0 turns it off"),
		stringFlag(flagProxyNamespace, "", "watch Proxies and cloud-init Secrets in this `NAMESPACE` only (default: all namespaces)"),
		intFlag(flagMaxConcurrentReconciles, 3, "Proxies reconciled in parallel"),
		intFlag(flagKubeAPIQPS, defaultKubeAPIQPS, "requests per second the controller makes to the Kubernetes API at most (client-side limit)"),
		intFlag(flagKubeAPIBurst, defaultKubeAPIBurst, "requests the controller may make to the Kubernetes API in a burst above --kube-api-qps"),
		durationFlag(flagRequeueNow, d.RequeueNow, "delay of an immediate next pass (after adoption, or once an instance is gone)"),
		durationFlag(flagProvisioningPoll, d.ProvisioningPoll, "how often an instance that is coming up is polled"),
		durationFlag(flagDeletionPoll, d.DeletionPoll, "how often a deleted instance is polled until it is gone"),
		durationFlag(flagDriftPoll, d.DriftPoll, "how often a running instance is re-checked"),
		durationFlag(flagQuotaRetry, d.QuotaRetry, "wait after a provider reported its quota exhausted"),
		durationFlag(flagPoolDrainPoll, pd.DrainPoll, "how often a ProxyPool with draining Proxies checks whether their leases ended"),
		durationFlag(flagAutoscaleInterval, pd.Autoscale, "how often a ProxyPool with spec.autoscaling recomputes its size"),
		durationFlag(flagRecycleInterval, pd.Recycle, "how often a ProxyPool with spec.recycle reads the bans from the lease store"),
	}, slices.Concat(runnableFlags(), healthFlags(), controllerLeaseAPIFlags(), webhookFlags(), tracingFlags(), statusFlags(), logFlags("json"))...)
}

// controllerSettings are the parsed flags, validated before anything starts.
type controllerSettings struct {
	kubeconfig, providersConfig string
	manager                     controller.ManagerOptions
	intervals                   controller.Intervals
	poolIntervals               controller.PoolIntervals
	maxConcurrent               int
	kubeAPIQPS, kubeAPIBurst    int
	logLevel                    slog.Level
	logJSON                     bool
}

// parseControllerFlags validates the flags, naming the one that is wrong.
func parseControllerFlags(c *cli.Context) (controllerSettings, error) {
	s := controllerSettings{
		kubeconfig:      c.Path(flagKubeconfig),
		providersConfig: c.Path(flagProvidersConfig),
		manager: controller.ManagerOptions{
			ProxyNamespace:          c.String(flagProxyNamespace),
			MetricsAddr:             c.String(flagMetricsListen),
			HealthProbeAddr:         c.String(flagHealthProbeListen),
			LeaderElection:          c.Bool(flagLeaderElect),
			LeaderElectionNamespace: c.String(flagLeaderElectionNamespace),
		},
		intervals: controller.Intervals{
			RequeueNow:       c.Duration(flagRequeueNow),
			ProvisioningPoll: c.Duration(flagProvisioningPoll),
			DeletionPoll:     c.Duration(flagDeletionPoll),
			DriftPoll:        c.Duration(flagDriftPoll),
			QuotaRetry:       c.Duration(flagQuotaRetry),
		},
		poolIntervals: controller.PoolIntervals{
			DrainPoll: c.Duration(flagPoolDrainPoll),
			Autoscale: c.Duration(flagAutoscaleInterval),
			Recycle:   c.Duration(flagRecycleInterval),
		},
		maxConcurrent: c.Int(flagMaxConcurrentReconciles),
		kubeAPIQPS:    c.Int(flagKubeAPIQPS),
		kubeAPIBurst:  c.Int(flagKubeAPIBurst),
	}
	if err := s.intervals.Validate(); err != nil {
		return s, err
	}
	if err := s.poolIntervals.Validate(); err != nil {
		return s, err
	}
	if s.maxConcurrent < 1 {
		return s, fmt.Errorf("--%s must be at least 1, got %d", flagMaxConcurrentReconciles, s.maxConcurrent)
	}
	if s.kubeAPIQPS < 1 {
		return s, fmt.Errorf("--%s must be at least 1, got %d", flagKubeAPIQPS, s.kubeAPIQPS)
	}
	if s.kubeAPIBurst < 1 {
		return s, fmt.Errorf("--%s must be at least 1, got %d", flagKubeAPIBurst, s.kubeAPIBurst)
	}
	var err error
	s.logLevel, s.logJSON, err = readLogFlags(c)
	return s, err
}

// runController wires the manager, the providers and the Proxy reconciler,
// and runs until SIGINT or SIGTERM.
// setupLeasesAndPools sets up the lease API (not leader-elected: every
// replica serves it), the status page, and the ProxyPool reconciler, which
// reads the API's leases.
func setupLeasesAndPools(mgr ctrl.Manager, s controllerSettings, ls leaseAPISettings, ss statusSettings, logger logr.Logger) error {
	api, err := setupLeaseAPI(mgr, ls, ctrlmetrics.Registry, logger)
	if err != nil {
		return err
	}
	if err := setupStatus(mgr, ss, api, s.manager.ProxyNamespace, logger); err != nil {
		return err
	}
	pr := &controller.ProxyPoolReconciler{Intervals: s.poolIntervals, Recycles: metrics.NewPoolRecycles(ctrlmetrics.Registry)}
	if api != nil { // a nil *API in the interface would not read as "no lease store"
		pr.Leases, pr.Bans = api, api
	}
	if err := pr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyPool reconciler: %w", err)
	}
	return nil
}

// setupProxyReconciler sets up the Proxy reconciler with its health
// engine, whose events are one of its watches (so the engine comes first).
func setupProxyReconciler(ctx context.Context, mgr ctrl.Manager, s controllerSettings, hs healthSettings, provs map[string]providers.Provider, logger logr.Logger) error {
	r := &controller.ProxyReconciler{
		Client:                  mgr.GetClient(),
		Providers:               provs,
		Intervals:               s.intervals,
		MaxConcurrentReconciles: s.maxConcurrent,
	}
	if _, err := setupHealth(mgr, r, hs, ctrlmetrics.Registry, logger); err != nil {
		return err
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the Proxy reconciler: %w", err)
	}
	return nil
}

func runController(c *cli.Context) error {
	s, rs, hs, ls, ss, err := parseControllerParts(c)
	if err != nil {
		return err
	}
	stderr := logging.Locked(c.App.ErrWriter) // shared by the logger and the console trace exporter
	logger := controllerLogger(stderr, s.logLevel, s.logJSON)
	s.manager.Logger = logger
	tr, stopTracing, err := tracing.Start(c.Context, "proxyfleet-controller", stderr, slog.New(logr.ToSlogHandler(logger)))
	if err != nil {
		return err
	}
	defer stopTracing()
	hs.probeTracing, ls.tracing = probeTracerProvider(c, tr, logger), tr.TracerProvider()
	// A broken providers config fails before anything connects.
	pcfg, err := loadProvidersConfig(s.providersConfig)
	if err != nil {
		return err
	}
	// Before connecting: a bad injection flag is named even without a cluster.
	ws, err := parseWebhookFlags(c)
	if err != nil {
		return err
	}
	cfg, err := restConfig(s.kubeconfig)
	if err != nil {
		return err
	}
	s.limitAPIRequests(cfg)
	ws.opts.Config.APIServerHosts = apiServerHosts(cfg)
	cfg.Wrap(tracing.ParentOnlyTransport(tr.TracerProvider()))
	mgr, err := controller.NewManager(cfg, s.manager)
	if err != nil {
		return err
	}
	if err := setupWebhook(mgr, ws, logger); err != nil {
		return err
	}
	provs, err := buildProviders(c.Context, pcfg, cfg, mgr, metrics.NewProviderRequests(ctrlmetrics.Registry))
	if err != nil {
		return fmt.Errorf("--%s %s: %w", flagProvidersConfig, s.providersConfig, err)
	}
	if provs == nil {
		logger.Info("WARNING: no --" + flagProvidersConfig + " given; only External Proxies will be served, Managed ones fail with ProviderNotConfigured")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := setupProxyReconciler(ctx, mgr, s, hs, provs, logger); err != nil {
		return err
	}
	// The manager's metrics server serves controller-runtime's registry.
	if err := registerProxyCollector(mgr, ctrlmetrics.Registry); err != nil {
		return err
	}
	if _, err := addRunnables(mgr, rs, s.manager.ProxyNamespace, pcfg, provs, ctrlmetrics.Registry, logger); err != nil {
		return err
	}
	if err := setupLeasesAndPools(mgr, s, ls, ss, logger); err != nil {
		return err
	}
	logger.Info("starting controller", "proxyNamespace", s.manager.ProxyNamespace, "providers", len(provs),
		"leaderElect", s.manager.LeaderElection, "metrics", s.manager.MetricsAddr, "healthProbe", s.manager.HealthProbeAddr)
	return mgr.Start(ctx)
}

// parseControllerParts reads the controller's own flags and each part's
// group, before anything starts.
func parseControllerParts(c *cli.Context) (s controllerSettings, rs runnableSettings, hs healthSettings, ls leaseAPISettings, ss statusSettings, err error) {
	if s, err = parseControllerFlags(c); err != nil {
		return
	}
	if rs, err = parseRunnableFlags(c); err != nil {
		return
	}
	if hs, err = parseHealthFlags(c); err != nil {
		return
	}
	if ls, err = parseLeaseAPIFlags(c); err != nil {
		return
	}
	if ss, err = parseStatusFlags(c); err != nil {
		return
	}
	ls.requests = ss.leaseRequests
	return
}

// limitAPIRequests sets the client-side rate limit of every client built
// from cfg (the manager's, the caches', the kubernetes provider's).
func (s controllerSettings) limitAPIRequests(cfg *rest.Config) {
	cfg.QPS, cfg.Burst = float32(s.kubeAPIQPS), s.kubeAPIBurst
}

// restConfig loads --kubeconfig when given, else the in-cluster config, else
// the usual $KUBECONFIG / ~/.kube/config rules.
func restConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--%s %s: %w", flagKubeconfig, path, err)
		}
		return cfg, nil
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes config: not in a cluster, and --kubeconfig / $KUBECONFIG / ~/.kube/config gave none: %w", err)
	}
	return cfg, nil
}
