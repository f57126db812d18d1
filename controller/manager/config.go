// Package manager owns the controller process's run: it loads the cluster
// config and limits the process's API requests, builds the controller
// manager (cache, leader election, metrics and probe servers), the Proxy
// reconciler with its health engine, the orphan GC and the provider health
// monitor, the lease API, the status page, the ProxyPool reconciler and the
// sidecar injection webhook, builds the configured providers with the
// constructors it is given, and serves until its context ends.
//
// It owns that wiring only. What each part does is its own package's
// (controller, controller/health, controller/leases, ...); flags are the
// command's (cmd/proxyfleet), which turns them into a Config, wires the
// provider types the binary carries, makes the context end on SIGTERM or
// SIGINT and calls Run. It must not import cmd or gateway packages: the
// gateway's run is gateway/daemon, and neither links the other.
package manager

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leasestore"
	"github.com/proxyfleet/proxyfleet/providers"
)

// Config is a controller's validated configuration: everything Run wires,
// parsed and checked before Run is called, so that a wrong setting is
// reported before anything connects.
type Config struct {
	// Kubeconfig is the kubeconfig file; "" is the in-cluster config, else
	// the usual $KUBECONFIG / ~/.kube/config rules.
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst are the client-side rate limit of every
	// request the process makes to the API server (the manager's, the
	// caches', the kubernetes provider's).
	KubeAPIQPS, KubeAPIBurst int

	// Manager is the manager's cache namespace, metrics and probe
	// addresses and leader election; Run sets its Logger.
	Manager controller.ManagerOptions
	// Intervals and MaxConcurrentReconciles are the Proxy reconciler's,
	// PoolIntervals the ProxyPool reconciler's.
	Intervals               controller.Intervals
	MaxConcurrentReconciles int
	PoolIntervals           controller.PoolIntervals

	// Providers are the providers Managed Proxies are served by.
	Providers Providers
	// GC is the orphan GC, ProviderChecks the provider health monitor.
	GC             GC
	ProviderChecks ProviderChecks
	// Health is the health engine.
	Health Health
	// LeaseAPI is the lease API every replica serves.
	LeaseAPI LeaseAPI
	// StatusListen serves the fleet's status page ("" off).
	StatusListen string
	// Webhook is the sidecar injection webhook, off when its Listen is "".
	// Run adds the API server's addresses (NO_PROXY) and its logger.
	Webhook inject.Options

	// Logs (LogJSON: JSON records, else text) and console spans go to
	// Stderr; the logger becomes every logger of the process.
	LogLevel slog.Level
	LogJSON  bool
	Stderr   io.Writer

	// Names are how the operator set the fields that errors and logs point
	// at.
	Names Names
}

// Providers are the configured providers and how to build them.
type Providers struct {
	// Config is the validated providers config; nil without one, when only
	// External Proxies are served and Managed ones fail with a condition
	// saying no providers config was given.
	Config *providers.Config
	// File is where Config was read from, for the errors of building it.
	File string
	// Installation is the ID stamped on every instance the providers create
	// and the only one the orphan GC deletes; "" reads the cluster's
	// (controller.InstallationID) when there are providers.
	Installation string
	// Constructors returns the constructor of every provider type the
	// binary carries, by type name, given what they may need of the run.
	Constructors func(Env) map[string]providers.Constructor
}

// Env is what a provider constructor may need of the run.
type Env struct {
	// Context outlives the run's cancellation, so that a provider's
	// credentials keep refreshing while the manager drains.
	Context context.Context
	// Client talks to the API server directly, not through the manager's
	// cache (which would start a cluster-wide informer of what it reads).
	Client client.Client
	// Logger is the process logger.
	Logger logr.Logger
}

// GC is the orphan GC's settings; it runs only with providers.
type GC struct {
	Interval, MinAge time.Duration
	// AllowNamespaced runs it even with Manager.ProxyNamespace set.
	AllowNamespaced bool
}

// ProviderChecks are the provider health monitor's settings (Interval 0:
// no checks; Timeout 0: derived from Interval).
type ProviderChecks struct {
	Interval, Timeout time.Duration
}

// Health is the health engine's settings.
type Health struct {
	Tick, MinReportInterval time.Duration
	Workers                 int
	// DefaultProbeURL probes the Proxies without spec.healthCheck.url; ""
	// leaves them unprobed.
	DefaultProbeURL string
	// TraceProbes makes a span per probe when a trace exporter is on.
	TraceProbes bool
}

// LeaseAPI is the lease API's settings (Listen "" off).
type LeaseAPI struct {
	Listen string
	// Token is the bearer token ("" open, with a warning).
	Token string
	// TokenReview also accepts service-account tokens for Audience.
	TokenReview bool
	Audience    string
	// Tenancy is what a pod identity may lease (leases.TenancyNamespaced,
	// the default, or leases.TenancyClusterWide for a migration).
	Tenancy string
	// Store is the lease store's windows; LeaseStore where it lives.
	Store      pool.StoreOptions
	LeaseStore leasestore.Config
}

// Names are how the operator knows the Config fields an error or a log
// line points at: a command's flags, such as --kubeconfig. An empty one
// reads as the field's name.
type Names struct {
	Kubeconfig, ProvidersConfig   string
	Installation                  string
	DefaultProbeURL, TraceProbes  string
	LeaseAPIListen, StatusListen  string
	WebhookListen, WebhookCertDir string
	GatewayImage                  string
}

// or is name, or field when name is empty.
func or(name, field string) string {
	if name == "" {
		return field
	}
	return name
}
