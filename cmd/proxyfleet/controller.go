//go:build !sidecar

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/manager"
)

// Flags of the controller process itself; each group of parts (runnables,
// health engine, lease API, webhook) names its own beside its reader.
// --metrics-listen, --log-level, --log-format and --config share the
// gateway's names and constants.
const (
	flagKubeconfig              = "kubeconfig"
	flagProvidersConfig         = "providers-config"
	flagInstallationID          = "installation-id"
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
// Proxy fleet alive.
func controllerCommand() *cli.Command { return controllerCommandWith(runController) }

// runController runs the controller of cfg (manager.Run) until SIGINT or
// SIGTERM, its logs going to stderr.
func runController(ctx context.Context, cfg *controllerConfig, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := cfg.Config
	c.Stderr = stderr
	return manager.Run(ctx, c)
}

// controllerRunner runs the controller from a validated configuration
// until ctx ends; tests substitute one to inspect the configuration.
type controllerRunner func(ctx context.Context, cfg *controllerConfig, stderr io.Writer) error

// controllerCommandWith builds the command around run. Like the gateway,
// every flag also reads PROXYFLEET_<FLAG_NAME> and its key in the --config
// file.
func controllerCommandWith(run controllerRunner) *cli.Command {
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
		Action: func(c *cli.Context) error {
			cfg, err := controllerConfigFrom(c)
			if err != nil {
				return err
			}
			return run(c.Context, cfg, c.App.ErrWriter)
		},
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
		listFlag(flagClusterTargetCIDRs, clusterTargetsUsage+"; the kubernetes provider's Squid Pods and the injected sidecars admit them"),
		stringFlag(flagInstallationID, "", "`ID` stamped on every instance this installation creates; the orphan GC deletes only instances with it, so installations sharing a cloud project or hypervisor leave each other's alone (default: the UID of the cluster's kube-system namespace)"),
		boolFlag(flagLeaderElect, "elect one active replica through a Lease"),
		stringFlag(flagLeaderElectionNamespace, "", "`NAMESPACE` of the leader-election Lease (default: the pod's namespace, else --proxy-namespace)"),
		stringFlag(flagMetricsListen, ":8080", "`ADDR` serving Prometheus /metrics; 0 turns it off"),
		stringFlag(flagHealthProbeListen, ":8081", "`ADDR` serving /healthz and /readyz; 0 turns it off"),
		stringFlag(flagProxyNamespace, "", "watch Proxies and cloud-init Secrets in this `NAMESPACE` only (default: all namespaces)"),
		intFlag(flagMaxConcurrentReconciles, 3, "Proxies reconciled in parallel"),
		intFlag(flagKubeAPIQPS, defaultKubeAPIQPS, "requests per second the controller makes to the Kubernetes API at most (client-side limit)"),
		intFlag(flagKubeAPIBurst, defaultKubeAPIBurst, "requests the controller may make to the Kubernetes API in a burst above --kube-api-qps"),
		durationFlag(flagRequeueNow, d.RequeueNow.String(), "delay of an immediate next pass (after adoption, or once an instance is gone)"),
		durationFlag(flagProvisioningPoll, d.ProvisioningPoll.String(), "how often an instance that is coming up is polled"),
		durationFlag(flagDeletionPoll, d.DeletionPoll.String(), "how often a deleted instance is polled until it is gone"),
		durationFlag(flagDriftPoll, d.DriftPoll.String(), "how often a running instance is re-checked"),
		durationFlag(flagQuotaRetry, d.QuotaRetry.String(), "wait after a provider reported its quota exhausted"),
		durationFlag(flagPoolDrainPoll, pd.DrainPoll.String(), "how often a ProxyPool with draining Proxies checks whether their leases ended"),
		durationFlag(flagAutoscaleInterval, pd.Autoscale.String(), "how often a ProxyPool with spec.autoscaling recomputes its size"),
		durationFlag(flagRecycleInterval, pd.Recycle.String(), "how often a ProxyPool with spec.recycle reads the bans from the lease store"),
	}, slices.Concat(runnableFlags(), healthFlags(), controllerLeaseAPIFlags(), webhookFlags(), tracingFlags(), statusFlags(), logFlags("json"))...)
}

// controllerConfig is the controller's validated configuration, the Config
// its run takes, parsed once so that an error never leaves anything
// running.
type controllerConfig struct {
	manager.Config
}

// controllerNames are the flags the controller's run names in its errors
// and logs.
var controllerNames = manager.Names{
	Kubeconfig:      "--" + flagKubeconfig,
	ProvidersConfig: "--" + flagProvidersConfig,
	Installation:    "--" + flagInstallationID,
	DefaultProbeURL: "--" + flagDefaultProbeURL,
	TraceProbes:     "--" + flagTraceHealthProbes,
	LeaseAPIListen:  "--" + flagLeaseAPIListen,
	StatusListen:    "--" + flagStatusListen,
	WebhookListen:   "--" + flagWebhookListen,
	WebhookCertDir:  "--" + flagWebhookCertDir,
	GatewayImage:    "--" + flagGatewayImage,
}

// controllerConfigFrom reads and checks every controller flag, naming the
// flag that is wrong. The providers config is read and the injection flags
// checked here too, so that a broken one is named even without a cluster.
func controllerConfigFrom(c *cli.Context) (*controllerConfig, error) {
	cfg := &controllerConfig{Config: manager.Config{Kubeconfig: c.Path(flagKubeconfig), Names: controllerNames}}
	for _, read := range []func(*cli.Context) error{cfg.readReconcilers, cfg.readProcess, cfg.readRunnables,
		cfg.readHealth, cfg.readLeaseAPI, cfg.readStatus, cfg.readProviders, cfg.readWebhook} {
		if err := read(c); err != nil {
			return nil, err
		}
	}
	if err := checkLeaseAPIAuth(cfg.LeaseAPI, c.Bool(flagInsecureAllowOpen)); err != nil {
		return nil, err
	}
	if err := checkStatusOpen(cfg.StatusListen, c.Bool(flagInsecureAllowOpen)); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readProcess reads the manager's options, the API rate limit and the log
// settings.
func (cfg *controllerConfig) readProcess(c *cli.Context) (err error) {
	cfg.Manager = controller.ManagerOptions{
		ProxyNamespace:          c.String(flagProxyNamespace),
		MetricsAddr:             c.String(flagMetricsListen),
		HealthProbeAddr:         c.String(flagHealthProbeListen),
		LeaderElection:          c.Bool(flagLeaderElect),
		LeaderElectionNamespace: c.String(flagLeaderElectionNamespace),
	}
	if cfg.KubeAPIQPS = c.Int(flagKubeAPIQPS); cfg.KubeAPIQPS < 1 {
		return fmt.Errorf("--%s must be at least 1, got %d", flagKubeAPIQPS, cfg.KubeAPIQPS)
	}
	if cfg.KubeAPIBurst = c.Int(flagKubeAPIBurst); cfg.KubeAPIBurst < 1 {
		return fmt.Errorf("--%s must be at least 1, got %d", flagKubeAPIBurst, cfg.KubeAPIBurst)
	}
	cfg.LogLevel, cfg.LogJSON, err = readLogFlags(c)
	return err
}

// readReconcilers reads the Proxy and ProxyPool reconcilers' periods and
// parallelism.
func (cfg *controllerConfig) readReconcilers(c *cli.Context) error {
	cfg.Intervals = controller.Intervals{
		RequeueNow:       c.Duration(flagRequeueNow),
		ProvisioningPoll: c.Duration(flagProvisioningPoll),
		DeletionPoll:     c.Duration(flagDeletionPoll),
		DriftPoll:        c.Duration(flagDriftPoll),
		QuotaRetry:       c.Duration(flagQuotaRetry),
	}
	cfg.PoolIntervals = controller.PoolIntervals{
		DrainPoll: c.Duration(flagPoolDrainPoll),
		Autoscale: c.Duration(flagAutoscaleInterval),
		Recycle:   c.Duration(flagRecycleInterval),
	}
	if err := cfg.Intervals.Validate(); err != nil {
		return err
	}
	if err := cfg.PoolIntervals.Validate(); err != nil {
		return err
	}
	if cfg.MaxConcurrentReconciles = c.Int(flagMaxConcurrentReconciles); cfg.MaxConcurrentReconciles < 1 {
		return fmt.Errorf("--%s must be at least 1, got %d", flagMaxConcurrentReconciles, cfg.MaxConcurrentReconciles)
	}
	return nil
}
