// Package daemon runs the gateway as a process: it opens the pool the
// gateway leases from (a store of its own, in memory or on Redis, or the
// controller's lease API behind its last-known pool), builds the gateway
// with its member sources and prober, opens every listener before anything
// starts, serves the proxy port, the lease API, the metrics and status page
// (with tracing) until its context ends or SIGTERM/SIGINT arrives, and
// drains.
//
// It owns that wiring only. How a request is served is package gateway's,
// which must not import this package, metrics or pool/leasestore (it
// records through its own small interfaces); flags are the command's
// (cmd/proxyfleet), which turns them into a Config and calls Run. It must
// not import cmd or controller packages: the sidecar build links it,
// without the controller.
package daemon

import (
	"crypto/x509"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/leasestore"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Config is a gateway's validated configuration: everything Run wires,
// parsed and checked before Run is called, so that nothing is left running
// when a setting is wrong.
type Config struct {
	// Listen is the proxy's host:port; APIListen serves the lease API
	// ("" off) and MetricsListen /metrics, /healthz, /readyz and the status
	// page ("" off).
	Listen, APIListen, MetricsListen string
	// StatusListen serves the status page on an address of its own (a
	// loopback one, which kubectl port-forward reaches in a pod) where the
	// metrics address is one others reach (a sidecar's probe port); ""
	// serves it on a loopback MetricsListen only.
	StatusListen string

	// The gateway's own pool: Static members, the UpstreamsFile (reloaded
	// every ReloadInterval; it holds the static members too), or with
	// neither the direct member. Probe is nil when members are not probed.
	Static         []pool.Member
	UpstreamsFile  string
	ReloadInterval time.Duration
	Probe          *ProbeConfig
	// Store is the lease store's windows; LeaseStore where it lives.
	Store      pool.StoreOptions
	LeaseStore leasestore.Config
	// APIToken is the lease API's bearer token ("" open, with a warning).
	APIToken string

	// PoolAPI (the lease API's URLs, as given) set is remote pool mode: the
	// gateway leases through PoolClient and holds no pool of its own. With
	// OutageGrace > 0 the last-known pool, refreshed every PoolRefresh,
	// rides out the API's outages, and a shared LeaseStore's (Redis) the
	// same way; 0 leases from either directly.
	PoolAPI     string
	PoolClient  *leaseapi.Client
	OutageGrace time.Duration
	PoolRefresh time.Duration

	// How requests are served: gateway.Options of the same names.
	Mode                rotation.Mode
	Classifier          rotation.Classifier
	BanBodyBytes        int
	MITM                *gateway.MITMOptions // nil: MITM off; Run closes its CA
	SiteRoots           *x509.CertPool       // nil: the system roots
	Retries             int
	Clients             []clients.Client
	AllowPrivateTargets bool
	ClusterTargets      []netip.Prefix
	DialTimeout         time.Duration
	RequestTimeout      time.Duration
	AnswerTimeout       time.Duration
	SiteTimeouts        sites.Durations
	ConnectHTTPPorts    []uint16
	MaxSessions         int64
	Pacing              pacing.Options
	// Tiers is the tier stage (--tiers, --tier-*); a member of the own
	// pool that names no tier is given the cheapest, one that names
	// another is refused (at start, and on a reload of the file).
	Tiers tiering.Options
	// ShutdownGrace bounds the drain of in-flight requests and tunnels.
	ShutdownGrace time.Duration
	// HTTPTimeouts bound the lease API's and the metrics address's
	// connections (zero fields: httpserver's defaults, which the command
	// leaves as they are; tests shrink them).
	HTTPTimeouts httpserver.Timeouts

	// Logs (LogJSON: JSON records, else text, with the usage block) and
	// console spans go to Stderr.
	LogLevel slog.Level
	LogJSON  bool
	Stderr   io.Writer

	// Names are how the operator set the fields that errors, logs and the
	// usage block point at.
	Names Names
}

// ProbeConfig is how the gateway probes its members.
type ProbeConfig struct {
	URL              string
	Interval         time.Duration
	Timeout          time.Duration
	SuccessThreshold int
	FailureThreshold int
}

// Names are how the operator knows the Config fields an error, a log line
// or the usage block points at: a command's flags, such as --listen. An
// empty one reads as the field's name.
type Names struct {
	Listen, APIListen, MetricsListen, StatusListen string
	// Static names every setting Static comes from.
	Static               string
	UpstreamsFile, Probe string
	OutageGrace          string
	// Clients and APIToken name where the tokens are read from.
	Clients, APIToken string
}

// or is name, or field when name is empty.
func or(name, field string) string {
	if name == "" {
		return field
	}
	return name
}
