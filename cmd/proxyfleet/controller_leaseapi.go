//go:build !sidecar

package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/leaseapi"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leasestore"
)

// Flags of the controller's lease API. The store flags (--lease-ttl,
// --max-lease-ttl, --cooldown, --max-cooldown, --failure-cooldown, --site-failure-cooldown,
// --max-leases-per-member) share the gateway's names and parsing.
const (
	flagLeaseAPIListen    = "lease-api-listen"
	flagLeaseAPITokenFile = "lease-api-token-file"
	// flagLeaseAPITokenReview also accepts pods' projected service-account
	// tokens (TokenReview + SubjectAccessReview).
	flagLeaseAPITokenReview   = "lease-api-token-review"
	flagLeaseAPITokenAudience = "lease-api-token-audience"
)

// defaultLeaseAPIListen is where the controller serves the lease API.
const defaultLeaseAPIListen = ":8090"

// controllerLeaseAPIFlags are the controller lease API's flags; controllerCommand
// appends them.
func controllerLeaseAPIFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagLeaseAPIListen, defaultLeaseAPIListen, "`ADDR` serving the lease API (GET /v1/proxies, POST /v1/leases, ...) on every replica; 0 turns it off"),
		pathFlag(flagLeaseAPITokenFile, "`FILE` holding the lease API's bearer token (exactly one; # comments); without it the API is open, with a WARNING in the log"),
		boolFlag(flagLeaseAPITokenReview, "also accept projected service-account tokens: a TokenReview, then a SubjectAccessReview for create leases.proxyfleet.io in the caller's namespace (bind ClusterRole proxyfleet-lease-user)"),
		stringFlag(flagLeaseAPITokenAudience, leaseapi.DefaultTokenAudience, "`AUDIENCE` the service-account tokens must be for"),
		durationFlag(flagLeaseTTL, pool.DefaultLeaseTTL, "lease lifetime when a request gives no ttlSeconds"),
		durationFlag(flagMaxLeaseTTL, pool.DefaultMaxLeaseTTL, "longest lease granted; a longer ttlSeconds is a 400"),
		durationFlag(flagCooldown, pool.DefaultCooldown, "how long a Proxy rests for a target after a reported ban, when no retryAfterSeconds came with it"),
		durationFlag(flagMaxCooldown, pool.DefaultMaxCooldown, "cap on a cooldown (retry-after and repeated-ban backoff included); also how long an ended lease still takes reports"),
		durationFlag(flagFailureCooldown, pool.DefaultFailureWindow, "how long a Proxy reported as failing (upstream_failed) is out for every target"),
		durationFlag(flagSiteFailureCooldown, pool.DefaultSiteFailureRest, "how long a Proxy rests for one target after a target_unreachable report (it could not reach that site)"),
		intFlag(flagMaxLeasesPerMember, 0, "cap on active leases per Proxy (0: unlimited)"),
		stringFlag(flagLeaseStore, "memory", leaseStoreUsage),
		pathFlag(flagLeaseStorePasswordFile, leaseStorePasswordUsage),
		stringFlag(flagLeaseStorePrefix, pool.DefaultRedisPrefix, leaseStorePrefixUsage),
		pathFlag(flagLeaseStoreCAFile, leaseStoreCAUsage),
		pathFlag(flagLeaseStoreCertFile, leaseStoreCertUsage),
		pathFlag(flagLeaseStoreKeyFile, leaseStoreKeyUsage),
		intFlag(flagLeaseStoreShards, 1, leaseStoreShardsUsage),
	}
}

// leaseAPISettings are the parsed lease API flags; listen "" is off.
type leaseAPISettings struct {
	listen     string
	token      string
	review     bool
	audience   string
	store      pool.StoreOptions
	leaseStore leasestore.Config
	tracing    trace.TracerProvider // nil: requests make no spans
	// requests also gets every lease request's outcome (the status page's chart); may be nil.
	requests metrics.OutcomeTap
}

// parseLeaseAPIFlags validates the lease API flags before anything
// connects, naming the flag that is wrong.
func parseLeaseAPIFlags(c *cli.Context) (leaseAPISettings, error) {
	var s leaseAPISettings
	var err error
	if s.store, err = storeOptionsFrom(c); err != nil {
		return s, err
	}
	if s.leaseStore, err = leaseStoreFrom(c); err != nil {
		return s, err
	}
	if f := c.Path(flagLeaseAPITokenFile); f != "" {
		if s.token, err = readSingleToken(flagLeaseAPITokenFile, f); err != nil {
			return s, err
		}
	}
	s.review = c.Bool(flagLeaseAPITokenReview)
	if s.audience = strings.TrimSpace(c.String(flagLeaseAPITokenAudience)); s.review && s.audience == "" {
		return s, fmt.Errorf("--%s: empty", flagLeaseAPITokenAudience)
	}
	switch addr := strings.TrimSpace(c.String(flagLeaseAPIListen)); addr {
	case "", "0", "off":
	default:
		if _, err := checkListenAddr(flagLeaseAPIListen, addr); err != nil {
			return s, err
		}
		s.listen = addr
	}
	return s, nil
}

// setupLeaseAPI adds the lease API (its Proxy source and server) to mgr and
// registers proxyfleet_lease_requests_total and the scrape-time pool gauges
// (leases_active, cooldowns_active, members, site_cooldowns) with reg. It returns nil when
// the API is off. The listener is open when it returns.
func setupLeaseAPI(mgr ctrl.Manager, s leaseAPISettings, reg prometheus.Registerer, logger logr.Logger) (*leaseapi.API, error) {
	if s.listen == "" {
		logger.Info("lease API off (--" + flagLeaseAPIListen + " 0)")
		return nil, nil
	}
	backend, _, err := s.leaseStore.Open(s.store, slog.New(logr.ToSlogHandler(logger.WithName("leasestore"))), reg)
	if err != nil {
		return nil, err
	}
	o := leaseapi.Options{
		Listen:   s.listen,
		Token:    s.token,
		Store:    s.store,
		Backend:  backend,
		Recorder: metrics.NewLeaseRequests(reg, s.requests),
		Logger:   logger,
		Tracing:  s.tracing,
	}
	if s.review {
		o.Reviewer = &leaseapi.Reviewer{Client: mgr.GetClient(), Audience: s.audience}
	}
	api, err := leaseapi.Setup(mgr, o)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagLeaseAPIListen, s.listen, err)
	}
	if err := reg.Register(metrics.NewPoolCollector(api.Store())); err != nil {
		return nil, fmt.Errorf("registering the lease pool gauges: %w", err)
	}
	if err := reg.Register(metrics.NewSiteCooldownCollector(api.Store(), 0)); err != nil {
		return nil, fmt.Errorf("registering the site cooldown gauge: %w", err)
	}
	return api, nil
}
