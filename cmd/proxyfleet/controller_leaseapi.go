//go:build !sidecar

package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/controller/manager"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Flags of the controller's lease API. The store flags (--lease-ttl,
// --max-lease-ttl, --cooldown, --max-cooldown, --failure-cooldown, --site-failure-cooldown,
// --max-leases-per-member) share the gateway's names and parsing.
// --lease-api-listen and --lease-api-token-file are the gateway's names
// (gateway.go): the lease API is served the same way by either command.
const (
	// flagLeaseAPITokenReview also accepts pods' projected service-account
	// tokens (TokenReview + SubjectAccessReview).
	flagLeaseAPITokenReview   = "lease-api-token-review"
	flagLeaseAPITokenAudience = "lease-api-token-audience"
	// flagLeaseAPITenancy says what a pod identity may lease.
	flagLeaseAPITenancy = "lease-api-tenancy"
)

// defaultLeaseAPIListen is where the controller serves the lease API.
const defaultLeaseAPIListen = ":8090"

// controllerLeaseAPIFlags are the controller lease API's flags; controllerCommand
// appends them.
func controllerLeaseAPIFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagLeaseAPIListen, defaultLeaseAPIListen, "`ADDR` serving the lease API (GET /v1/proxies, POST /v1/leases, ...) on every replica; 0 turns it off"),
		pathFlag(flagLeaseAPITokenFile, "`FILE` holding the lease API's bearer token (exactly one; # comments); a non-loopback --lease-api-listen needs it, --lease-api-token-review or --insecure-allow-open"),
		boolFlag(flagLeaseAPITokenReview, "also accept projected service-account tokens: a TokenReview, then a SubjectAccessReview for create leases.proxyfleet.io in the caller's namespace (bind ClusterRole proxyfleet-lease-user)"),
		stringFlag(flagLeaseAPITokenAudience, leases.DefaultTokenAudience, "`AUDIENCE` the service-account tokens must be for"),
		stringFlag(flagLeaseAPITenancy, leases.TenancyNamespaced, "`MODE` of a pod identity's leases: namespaced (its own namespace's Proxies and those a ProxyGrant shares with it) or cluster-wide (every namespace's, as before ProxyGrants; for a migration, docs/tenancy.md)"),
		boolFlag(flagInsecureAllowOpen, "serve the lease API on a non-loopback --lease-api-listen without --lease-api-token-file or --lease-api-token-review (anyone who reaches the port can lease and report bans), and the status page on a non-loopback --status-listen (anyone who reaches it sees the fleet)"),
		durationFlag(flagLeaseTTL, pool.DefaultLeaseTTL.String(), "lease lifetime when a request gives no ttlSeconds"),
		durationFlag(flagMaxLeaseTTL, pool.DefaultMaxLeaseTTL.String(), "longest lease granted; a longer ttlSeconds is a 400"),
		durationFlag(flagCooldown, pool.DefaultCooldown.String(), "how long a Proxy rests for a target after a reported ban, when no retryAfterSeconds came with it"),
		durationFlag(flagMaxCooldown, pool.DefaultMaxCooldown.String(), "cap on a cooldown (retry-after and repeated-ban backoff included); also how long an ended lease still takes reports"),
		durationFlag(flagFailureCooldown, pool.DefaultFailureWindow.String(), "how long a Proxy reported as failing (upstream_failed) is out for every target"),
		durationFlag(flagSiteFailureCooldown, pool.DefaultSiteFailureRest.String(), "how long a Proxy rests for one target after a target_unreachable report (it could not reach that site)"),
		intFlag(flagMaxLeasesPerMember, 0, "cap on active leases per Proxy (0: unlimited)"),
		intFlag(flagMaxFailureRestPercent, rotation.DefaultMaxFailureRestPercent, failureRestUsage),
		stringFlag(flagLeaseStore, "memory", leaseStoreUsage),
		pathFlag(flagLeaseStorePasswordFile, leaseStorePasswordUsage),
		stringFlag(flagLeaseStorePrefix, pool.DefaultRedisPrefix, leaseStorePrefixUsage),
		pathFlag(flagLeaseStoreCAFile, leaseStoreCAUsage),
		pathFlag(flagLeaseStoreCertFile, leaseStoreCertUsage),
		pathFlag(flagLeaseStoreKeyFile, leaseStoreKeyUsage),
		intFlag(flagLeaseStoreShards, 1, leaseStoreShardsUsage),
	}
}

// readLeaseAPI reads the lease API flags, naming the one that is wrong.
func (cfg *controllerConfig) readLeaseAPI(c *cli.Context) (err error) {
	cfg.LeaseAPI, err = leaseAPIFrom(c)
	return err
}

// leaseAPIFrom reads the lease API flags: its store's windows and where the
// store lives, its token, its token review and its address.
func leaseAPIFrom(c *cli.Context) (manager.LeaseAPI, error) {
	var s manager.LeaseAPI
	var err error
	if s.Store, err = storeOptionsFrom(c); err != nil {
		return s, err
	}
	if s.LeaseStore, err = leaseStoreFrom(c); err != nil {
		return s, err
	}
	if f := c.Path(flagLeaseAPITokenFile); f != "" {
		if s.Token, err = readSingleToken(flagLeaseAPITokenFile, f); err != nil {
			return s, err
		}
	}
	s.TokenReview = c.Bool(flagLeaseAPITokenReview)
	if s.Audience = strings.TrimSpace(c.String(flagLeaseAPITokenAudience)); s.TokenReview && s.Audience == "" {
		return s, fmt.Errorf("--%s: empty", flagLeaseAPITokenAudience)
	}
	switch s.Tenancy = strings.TrimSpace(c.String(flagLeaseAPITenancy)); s.Tenancy {
	case leases.TenancyNamespaced, leases.TenancyClusterWide:
	default:
		return s, fmt.Errorf("--%s %q: want %s or %s", flagLeaseAPITenancy, s.Tenancy, leases.TenancyNamespaced, leases.TenancyClusterWide)
	}
	s.Listen, err = optionalListen(c, flagLeaseAPIListen)
	return s, err
}

// checkLeaseAPIAuth applies the gateway's never-open-by-accident rule to
// the controller's lease API: an unauthenticated API hands out no logins,
// but whoever reaches it can still list the fleet, hold its capacity and
// report bans that rest every member for a site. So a non-loopback address
// needs a token, token review, or --insecure-allow-open said out loud. It is
// checked after every other flag, so a wrong flag is named first.
func checkLeaseAPIAuth(s manager.LeaseAPI, open bool) error {
	if s.Listen == "" || s.Token != "" || s.TokenReview || open {
		return nil
	}
	if loopback, err := checkListenAddr(flagLeaseAPIListen, s.Listen); err != nil || loopback {
		return err
	}
	return fmt.Errorf("--%s %s is not loopback: set --%s or --%s, --%s 0 to turn the API off, or --%s to serve it without auth",
		flagLeaseAPIListen, s.Listen, flagLeaseAPITokenFile, flagLeaseAPITokenReview, flagLeaseAPIListen, flagInsecureAllowOpen)
}
