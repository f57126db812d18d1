package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/leasestore"
)

// storeOptionsFrom reads the lease store flags the gateway and the
// controller share (--lease-ttl, --max-lease-ttl, --cooldown,
// --max-cooldown, --failure-cooldown, --site-failure-cooldown,
// --max-leases-per-member, --max-failure-rest-percent), naming the
// flag that is wrong.
func storeOptionsFrom(c *cli.Context) (pool.StoreOptions, error) {
	var o pool.StoreOptions
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{flagLeaseTTL, &o.DefaultTTL},
		{flagMaxLeaseTTL, &o.MaxTTL},
		{flagCooldown, &o.Cooldown.Default},
		{flagMaxCooldown, &o.Cooldown.Max},
		{flagFailureCooldown, &o.FailureWindow},
		{flagSiteFailureCooldown, &o.SiteFailureRest},
	} {
		v := c.Duration(d.name)
		if v <= 0 {
			return o, fmt.Errorf("--%s %s: must be positive", d.name, v)
		}
		*d.dst = v
	}
	if o.DefaultTTL > o.MaxTTL {
		return o, fmt.Errorf("--%s %s is above --%s %s", flagLeaseTTL, o.DefaultTTL, flagMaxLeaseTTL, o.MaxTTL)
	}
	if o.Cooldown.Max < o.Cooldown.Default {
		return o, fmt.Errorf("--%s %s is below --%s %s", flagMaxCooldown, o.Cooldown.Max, flagCooldown, o.Cooldown.Default)
	}
	if o.MaxLeasesPerMember = c.Int(flagMaxLeasesPerMember); o.MaxLeasesPerMember < 0 {
		return o, fmt.Errorf("--%s %d: must be 0 (unlimited) or more", flagMaxLeasesPerMember, o.MaxLeasesPerMember)
	}
	if p := c.Int(flagMaxFailureRestPercent); p < 1 || p > 100 {
		return o, fmt.Errorf("--%s %d: must be a percentage from 1 to 100", flagMaxFailureRestPercent, p)
	} else {
		o.FailureRest.MaxPercent = p
	}
	return o, nil
}

// poolAPIConflicts are the gateway flags that give it a pool of its own, so
// they make no sense with --lease-api.
var poolAPIConflicts = []string{flagUpstream, flagUpstreamsFile, flagEgressAddr, flagProbeURL, flagLeaseAPIListen}

// poolAPIStoreFlags configure a lease store, which a --lease-api gateway does
// not have: the controller's own flags decide. Accepting and ignoring them
// would let an operator believe a cooldown was changed when it was not.
var poolAPIStoreFlags = []string{flagMaxLeaseTTL, flagCooldown, flagMaxCooldown, flagFailureCooldown, flagSiteFailureCooldown, flagMaxLeasesPerMember, flagMaxFailureRestPercent,
	flagLeaseStore, flagLeaseStorePasswordFile, flagLeaseStorePrefix, flagLeaseStoreCAFile, flagLeaseStoreCertFile, flagLeaseStoreKeyFile, flagLeaseStoreShards}

// poolAPIFrom reads --lease-api and --pool-token-file: a valid lease API URL
// (never echoed with credentials), exactly one token, and none of the flags
// that would give the gateway a pool of its own. An empty apiURL means the
// gateway holds its own pool.
func poolAPIFrom(c *cli.Context) (apiURL, token string, err error) {
	apiURL = strings.TrimSpace(c.String(flagLeaseAPI))
	tokenFile := c.Path(flagPoolTokenFile)
	if apiURL == "" {
		for _, name := range []string{flagPoolTokenFile, flagPoolSATokenFile, flagPoolSelector} {
			if c.IsSet(name) {
				return "", "", fmt.Errorf("--%s needs --%s (the lease API it is for)", name, flagLeaseAPI)
			}
		}
		return "", "", nil
	}
	if tokenFile != "" && c.Path(flagPoolSATokenFile) != "" {
		return "", "", fmt.Errorf("--%s and --%s exclude each other: one is a fixed token, the other a rotating one", flagPoolTokenFile, flagPoolSATokenFile)
	}
	for _, name := range poolAPIConflicts {
		if c.IsSet(name) {
			return "", "", fmt.Errorf("--%s and --%s exclude each other: with --%s the gateway leases from the controller's pool and holds none of its own",
				flagLeaseAPI, name, flagLeaseAPI)
		}
	}
	for _, name := range poolAPIStoreFlags {
		if c.IsSet(name) {
			return "", "", fmt.Errorf("--%s has no effect with --%s: the gateway then holds no lease store; set it on proxyfleet controller",
				name, flagLeaseAPI)
		}
	}
	if tokenFile != "" {
		if token, err = readSingleToken(flagPoolTokenFile, tokenFile); err != nil {
			return "", "", err
		}
	}
	// NewClient's errors show the URL redacted.
	if _, err := leaseapi.NewClient(apiURL, token, nil); err != nil {
		return "", "", fmt.Errorf("--%s: %w", flagLeaseAPI, err)
	}
	return apiURL, token, nil
}

// failureRestUsage is --max-failure-rest-percent's help, the same for the
// gateway and the controller.
const failureRestUsage = "most `PERCENT` (1-100) of the healthy members that rest for their own failures (--failure-cooldown) at once; " +
	"a further failure ends the rest of the member that failed longest ago, and when only resting members are left the least recently failed is tried anyway"

// The lease store flags the gateway and the controller share.
const (
	flagLeaseStore             = "lease-store"
	flagLeaseStorePasswordFile = "lease-store-password-file"
	flagLeaseStorePrefix       = "lease-store-prefix"
	flagLeaseStoreCAFile       = "lease-store-ca-file"
	flagLeaseStoreCertFile     = "lease-store-cert-file"
	flagLeaseStoreKeyFile      = "lease-store-key-file"
	flagLeaseStoreShards       = "lease-store-shards"

	leaseStoreUsage = "`URL` of the lease store: memory (this process only), redis://[user:password@]host:port[/db], rediss://... (TLS), " +
		"redis+sentinel://host:port[,host:port...]/master[/db] or redis+cluster://host:port[,host:port...]; a shared Redis keeps leases and cooldowns across restarts and replicas"
	leaseStorePasswordUsage = "`FILE` holding the Redis password for --lease-store (instead of one in the URL)"
	leaseStorePrefixUsage   = "`PREFIX` of the lease store's Redis keys (several fleets, one Redis); also the Redis Cluster hash tag"
	leaseStoreCAUsage       = "PEM `FILE` of the CAs that sign the Redis server's certificate (rediss:// URLs; default: the system roots)"
	leaseStoreCertUsage     = "PEM `FILE` of a client certificate presented to Redis (rediss://, with --lease-store-key-file)"
	leaseStoreKeyUsage      = "PEM `FILE` of the key of --lease-store-cert-file"
	leaseStoreShardsUsage   = "`N` groups the Redis store splits the members into, each under a hash tag of its own, so a Redis Cluster's primaries share the fleet's work (1: every key in one slot); every gateway and controller of a prefix must use the same N"
)

// leaseStoreNames are the flags of the lease store's settings, for the
// errors and logs of opening it.
var leaseStoreNames = leasestore.Names{URL: "--" + flagLeaseStore, CAFile: "--" + flagLeaseStoreCAFile,
	CertFile: "--" + flagLeaseStoreCertFile, KeyFile: "--" + flagLeaseStoreKeyFile}

// leaseStoreFrom reads --lease-store, --lease-store-password-file,
// --lease-store-prefix and the TLS files. A malformed URL is an error naming
// the flag, with the password masked; a TLS file with a plaintext URL is an
// error, never a silent plaintext connection.
func leaseStoreFrom(c *cli.Context) (leasestore.Config, error) {
	l := leasestore.Config{Names: leaseStoreNames}
	raw := strings.TrimSpace(c.String(flagLeaseStore))
	l.Prefix = strings.TrimSpace(c.String(flagLeaseStorePrefix))
	pwFile := c.Path(flagLeaseStorePasswordFile)
	if raw == "" || raw == "memory" {
		for _, name := range []string{flagLeaseStorePasswordFile, flagLeaseStorePrefix, flagLeaseStoreCAFile, flagLeaseStoreCertFile, flagLeaseStoreKeyFile, flagLeaseStoreShards} {
			if c.IsSet(name) {
				return l, fmt.Errorf("--%s needs a Redis --%s (the in-memory store has no password, prefix or shards)", name, flagLeaseStore)
			}
		}
		return l, nil
	}
	if err := leasestore.CheckURL(raw); err != nil {
		return l, fmt.Errorf("--%s: %w", flagLeaseStore, err)
	}
	if l.Prefix == "" || strings.ContainsAny(l.Prefix, "{} ") {
		return l, fmt.Errorf("--%s %q: want a non-empty prefix without braces or spaces", flagLeaseStorePrefix, l.Prefix)
	}
	if l.Shards = c.Int(flagLeaseStoreShards); l.Shards < 1 || l.Shards > pool.MaxRedisShards {
		return l, fmt.Errorf("--%s %d: want 1 to %d", flagLeaseStoreShards, l.Shards, pool.MaxRedisShards)
	}
	if pwFile != "" {
		b, err := os.ReadFile(pwFile)
		if err != nil {
			return l, fmt.Errorf("--%s: %w", flagLeaseStorePasswordFile, err)
		}
		if l.Password = strings.TrimSpace(string(b)); l.Password == "" || strings.ContainsAny(l.Password, "\r\n") {
			return l, fmt.Errorf("--%s %s: want exactly one line holding the password", flagLeaseStorePasswordFile, pwFile)
		}
	}
	l.CAFile, l.CertFile, l.KeyFile = c.Path(flagLeaseStoreCAFile), c.Path(flagLeaseStoreCertFile), c.Path(flagLeaseStoreKeyFile)
	if l.CAFile != "" || l.CertFile != "" || l.KeyFile != "" {
		if !strings.HasPrefix(raw, "rediss") {
			name := flagLeaseStoreCAFile
			if l.CAFile == "" {
				name = flagLeaseStoreCertFile
			}
			return l, fmt.Errorf("--%s needs a TLS --%s (rediss://, rediss+sentinel:// or rediss+cluster://), not %s: the connection would be plaintext",
				name, flagLeaseStore, redact.URL(raw))
		}
		if (l.CertFile == "") != (l.KeyFile == "") {
			return l, fmt.Errorf("--%s and --%s go together (a client certificate and its key)", flagLeaseStoreCertFile, flagLeaseStoreKeyFile)
		}
	}
	l.URL = raw
	return l, nil
}

// poolClientFrom builds the lease API client of a --lease-api gateway from
// its validated settings: the fixed token, or the rotating token file
// (--pool-sa-token-file, read now and re-read as the kubelet rotates it), and
// the default selector (--pool-selector).
func poolClientFrom(c *cli.Context, apiURL, token string) (*leaseapi.Client, error) {
	sel, err := pool.ParseSelector(c.String(flagPoolSelector))
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagPoolSelector, err)
	}
	cl, err := leaseapi.NewClientWith(apiURL, leaseapi.ClientOptions{Token: token, TokenFile: c.Path(flagPoolSATokenFile), Selector: sel})
	if err != nil {
		if f := c.Path(flagPoolSATokenFile); f != "" {
			return nil, fmt.Errorf("--%s %s: %w", flagPoolSATokenFile, f, err)
		}
		return nil, fmt.Errorf("--%s: %w", flagLeaseAPI, err)
	}
	return cl, nil
}

// outageFrom reads the last-known pool's flags of a --lease-api gateway:
// the grace (0 turns it off) and the member list's refresh interval.
func outageFrom(c *cli.Context) (grace, refresh time.Duration, err error) {
	if grace = c.Duration(flagPoolOutageGrace); grace < 0 {
		return 0, 0, fmt.Errorf("--%s %s: must be 0 (off) or more", flagPoolOutageGrace, grace)
	}
	if refresh = c.Duration(flagPoolRefresh); refresh <= 0 {
		return 0, 0, fmt.Errorf("--%s %s: must be positive", flagPoolRefresh, refresh)
	}
	return grace, refresh, nil
}
