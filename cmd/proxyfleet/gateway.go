package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/daemon"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Gateway flag names, in one place so validation messages and tests cannot
// drift from the flags themselves.
const (
	flagListen                = "listen"
	flagUpstream              = "upstream"
	flagUpstreamsFile         = "upstreams-file"
	flagUpstreamsReload       = "upstreams-reload-interval"
	flagEgressAddr            = "egress-addr"
	flagRotation              = "rotation"
	flagLeaseTTL              = "lease-ttl"
	flagMaxLeaseTTL           = "max-lease-ttl"
	flagCooldown              = "cooldown"
	flagMaxCooldown           = "max-cooldown"
	flagFailureCooldown       = "failure-cooldown"
	flagSiteFailureCooldown   = "site-failure-cooldown"
	flagRateLimitStatus       = "rate-limit-status"
	flagBanStatus             = "ban-status"
	flagBanRule               = "ban-rule"
	flagBanBodyBytes          = "ban-body-bytes"
	flagMITMCACert            = "mitm-ca-cert"
	flagMITMCAKey             = "mitm-ca-key"
	flagMITMBypass            = "mitm-bypass"
	flagConnectHTTPPorts      = "connect-http-ports"
	flagMaxSessions           = "max-sessions"
	flagMITMFingerprint       = "mitm-fingerprint"
	flagMITMFallbackPreset    = "mitm-fallback-preset"
	flagUpstreamCAFile        = "upstream-ca-file"
	flagRetries               = "retries"
	flagMaxLeasesPerMember    = "max-leases-per-member"
	flagMaxFailureRestPercent = "max-failure-rest-percent"
	flagAuthTokenFile         = "auth-token-file"
	flagInsecureAllowOpen     = "insecure-allow-open"
	flagAllowPrivateTargets   = "allow-private-targets"
	flagClusterTargetCIDRs    = "cluster-target-cidrs"
	flagProbeURL              = "probe-url"
	flagProbeInterval         = "probe-interval"
	flagProbeTimeout          = "probe-timeout"
	flagProbeSuccessThreshold = "probe-success-threshold"
	flagProbeFailureThreshold = "probe-failure-threshold"
	flagLeaseAPIListen        = "lease-api-listen"
	flagLeaseAPITokenFile     = "lease-api-token-file"
	flagLeaseAPI              = "lease-api"
	flagPoolTokenFile         = "pool-token-file"
	flagPoolSATokenFile       = "pool-sa-token-file"
	flagPoolSelector          = "pool-selector"
	flagPoolOutageGrace       = "pool-outage-grace"
	flagPoolRefresh           = "pool-refresh-interval"
	flagMetricsListen         = "metrics-listen"
	// flagStatusListen is where a status page is served: the controller's
	// (controller_statuspage.go), or a gateway's on an address of its own.
	flagStatusListen        = "status-listen"
	flagShutdownGrace       = "shutdown-grace"
	flagDialTimeout         = "dial-timeout"
	flagRequestTimeout      = "request-timeout"
	flagMemberAnswerTimeout = "member-answer-timeout"
	flagSiteAnswerTimeout   = "site-answer-timeout"
	flagSiteMinInterval     = "site-min-interval"
	flagSiteMaxConcurrency  = "site-max-concurrency"
	flagSitePace            = "site-pace"
	flagPacing              = "pacing"
	flagPacingMaxWait       = "pacing-max-wait"
	flagPacingWindow        = "pacing-window"
	flagPacingIncreaseSteps = "pacing-increase-steps"
	flagPacingMemory        = "pacing-memory"
	flagTiers               = "tiers"
	flagTierEscalateBans    = "tier-escalate-bans"
	flagTierEscalateWindow  = "tier-escalate-window"
	flagTierHold            = "tier-hold"
	flagTierProbeEvery      = "tier-probe-every"
	flagConfig              = "config"
	flagLogLevel            = "log-level"
	flagLogFormat           = "log-format"
)

// gatewayCommand is `proxyfleet gateway`: the standalone rotating gateway.
func gatewayCommand() *cli.Command { return gatewayCommandWith(runGateway) }

// runGateway runs the gateway of cfg until ctx ends (daemon.Run), its logs
// and usage block going to stderr.
func runGateway(ctx context.Context, cfg *gatewayConfig, stderr io.Writer) error {
	c := cfg.Config
	c.Stderr = stderr
	return daemon.Run(ctx, c)
}

// gatewayRunner runs the gateway from a validated configuration until ctx
// ends; tests substitute one to inspect the configuration.
type gatewayRunner func(ctx context.Context, cfg *gatewayConfig, stderr io.Writer) error

// gatewayCommandWith builds the command around run.
func gatewayCommandWith(run gatewayRunner) *cli.Command {
	flags := gatewayFlags()
	return &cli.Command{
		Name:  "gateway",
		Usage: "run the rotating egress gateway (HTTP/HTTPS forward proxy over a pool of upstreams)",
		Description: "Point HTTPS_PROXY/HTTP_PROXY at --listen. Every flag can also be set with the environment\n" +
			"variable shown, or as a key (the flag name without dashes) in the YAML file given by --config;\n" +
			"a flag beats the environment, which beats the file, which beats the default.",
		Flags:        flags,
		Before:       initConfigFile(flagConfig, flags),
		OnUsageError: usageError("gateway"),
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return fmt.Errorf("gateway takes no arguments, got %q (flags start with --)", c.Args().First())
			}
			cfg, err := gatewayConfigFrom(c)
			if err != nil {
				return err
			}
			return run(c.Context, cfg, c.App.ErrWriter)
		},
	}
}

// singleDashFlag finds a flag name as the flag package quotes it in errors.
var singleDashFlag = regexp.MustCompile(`(flag |for |: )-([a-z][a-z-]*)`)

// usageError is every command's answer to a bad command line: the flag
// package writes "-name", the flags are documented as "--name", its
// "parse error" says what the value should have been, and the message
// points at the command's --help.
func usageError(command string) cli.OnUsageErrorFunc {
	return func(c *cli.Context, err error, _ bool) error {
		msg := singleDashFlag.ReplaceAllString(err.Error(), "$1--$2")
		if m := parseErrorFlag.FindStringSubmatch(msg); m != nil && c != nil && c.Command != nil {
			if want := wantedValue(c.Command.Flags, m[1]); want != "" {
				msg = strings.TrimSuffix(msg, "parse error") + want
			}
		}
		return fmt.Errorf("%s (see proxyfleet %s --help)", msg, command)
	}
}

// parseErrorFlag finds the flag whose value the flag package could not parse.
var parseErrorFlag = regexp.MustCompile(`for (?:flag )?--([a-z][a-z0-9-]*): parse error$`)

// wantedValue says what flag name of flags takes, "" when it is not a
// kind whose parse error needs saying.
func wantedValue(flags []cli.Flag, name string) string {
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		switch f.(type) {
		case *cli.DurationFlag, *altsrc.DurationFlag:
			return "want a duration with a unit, such as 30s, 10m or 1h30m"
		case *cli.IntFlag, *altsrc.IntFlag, *cli.Int64Flag, *altsrc.Int64Flag, *cli.UintFlag, *altsrc.UintFlag:
			return "want a whole number"
		case *cli.BoolFlag, *altsrc.BoolFlag:
			return "want true or false"
		case *cli.Float64Flag, *altsrc.Float64Flag:
			return "want a number"
		}
	}
	return ""
}

// gatewayFlags are the gateway's flags. Each reads PROXYFLEET_<NAME> from the
// environment and <name> from the --config file (altsrc wrappers).
func gatewayFlags() []cli.Flag {
	return append([]cli.Flag{
		stringFlag(flagListen, "127.0.0.1:3128", "`ADDR` (host:port) the proxy listens on; a non-loopback address needs --auth-token-file or --insecure-allow-open"),
		listFlag(flagUpstream, "upstream proxy `URL` (http://, https://, socks5:// or socks5h://, optional user:password@, explicit port); repeatable"),
		pathFlag(flagUpstreamsFile, "`FILE` of upstreams, one per line: URL [key=value ...]; # comments; reloaded when it changes"),
		durationFlag(flagUpstreamsReload, "2s", "how often to check --upstreams-file for changes"),
		listFlag(flagEgressAddr, "local source `IP` for direct egress (one member per address); repeatable"),
		stringFlag(flagRotation, "sticky", "`MODE`: sticky (keep an upstream per session and target for --lease-ttl) or per-request"),
		durationFlag(flagLeaseTTL, "60s", "how long a session keeps its upstream for a target in sticky mode"),
		durationFlag(flagMaxLeaseTTL, "1h", "longest lease a client may ask for (sessttl, lease API)"),
		durationFlag(flagCooldown, "10m", "how long an upstream rests for a target after a ban, when the site sent no Retry-After"),
		durationFlag(flagMaxCooldown, "1h", "cap on a cooldown (Retry-After and repeated-ban backoff included)"),
		durationFlag(flagFailureCooldown, "30s", "how long a failing upstream (refused, reset, timed out, TLS/SOCKS5 handshake, 407) is out for every target"),
		durationFlag(flagSiteFailureCooldown, "10s", "how long an upstream rests for one target after answering that it cannot reach it (DNS, connect, access)"),
		stringFlag(flagRateLimitStatus, "429", "comma-separated `STATUSES` read as rate limiting (cooldown honours Retry-After); empty turns it off"),
		stringFlag(flagBanStatus, "403", "comma-separated `STATUSES` read as a ban; empty turns it off"),
		listFlag(flagBanRule, "`RULE` read as a ban beyond the status lists: space-separated status=LIST header:NAME~REGEX body~REGEX action=rate_limited|banned, or preset=cloudflare-challenge|captcha|empty-200; repeatable"),
		intFlag(flagBanBodyBytes, 65536, "how much of a body --ban-rule body~ patterns search (read ahead only when a rule needs it)"),
		pathFlag(flagMITMCACert, "CA certificate `FILE` (PEM): with --mitm-ca-key, intercept HTTPS so bans, rules and retries work inside CONNECT (proxyfleet mitm-ca init writes one)"),
		pathFlag(flagMITMCAKey, "CA private key `FILE` (PEM) for --mitm-ca-cert"),
		listFlag(flagMITMBypass, "`HOST` (name, *.domain or IP) kept as a plain tunnel under MITM (pinned or mutual-TLS sites); repeatable"),
		stringFlag(flagConnectHTTPPorts, "80", "comma-separated `PORTS` whose CONNECT tunnels the gateway answers itself and reads as plain HTTP, sending each request (a WebSocket handshake too) through a member as a plain one: browsers open ws:// with CONNECT to port 80, which Squids refuse; empty turns it off"),
		stringFlag(flagMITMFingerprint, string(gateway.FingerprintMirror), "the TLS handshake a MITM'd site sees: `MODE` mirror (the client's own ClientHello, a site connection per client connection) or go (Go's crypto/tls, connections pooled across clients)"),
		stringFlag(flagMITMFallbackPreset, mirror.DefaultPreset, "the browser ClientHello `PRESET` a site sees when the client's cannot be mirrored, and the first among equally close presets when the gateway cannot complete the client's with a site: "+strings.Join(mirror.Presets(), ", ")),
		pathFlag(flagUpstreamCAFile, "PEM `FILE` of CAs trusted for sites' certificates besides the system roots (MITM and https:// URIs)"),
		intFlag(flagRetries, 2, "how many other upstreams an idempotent request is retried on after a ban or an upstream failure"),
		intFlag(flagMaxLeasesPerMember, 0, "cap on active leases per upstream (0: unlimited)"),
		intFlag(flagMaxFailureRestPercent, rotation.DefaultMaxFailureRestPercent, failureRestUsage),
		intFlag(flagMaxSessions, int(gateway.DefaultAffinityEntries), "most live sticky sessions ((session, site) pins) the gateway holds: a new one beyond it is answered 503 session_limit, a live one is never evicted"),
		stringFlag(flagLeaseStore, "memory", leaseStoreUsage),
		pathFlag(flagLeaseStorePasswordFile, leaseStorePasswordUsage),
		stringFlag(flagLeaseStorePrefix, pool.DefaultRedisPrefix, leaseStorePrefixUsage),
		pathFlag(flagLeaseStoreCAFile, leaseStoreCAUsage),
		pathFlag(flagLeaseStoreCertFile, leaseStoreCertUsage),
		pathFlag(flagLeaseStoreKeyFile, leaseStoreKeyUsage),
		intFlag(flagLeaseStoreShards, 1, leaseStoreShardsUsage),
		pathFlag(flagAuthTokenFile, "`FILE` of token clients, one per line: NAME TOKEN (the Proxy-Authorization password) and what it may use: all, pool=NAMESPACE/POOL or select=K=V[,K=V] (docs/tenancy.md#token-clients); # comments"),
		boolFlag(flagInsecureAllowOpen, "allow listening on a non-loopback address without client authentication (an open proxy)"),
		boolFlag(flagAllowPrivateTargets, "allow targets in loopback, private, link-local and unique-local ranges (for tests)"),
		listFlag(flagClusterTargetCIDRs, clusterTargetsUsage),
		stringFlag(flagProbeURL, "", "`URL` to fetch through every upstream to decide its health (empty: no probes, upstreams count as healthy)"),
		durationFlag(flagProbeInterval, "10s", "time between probes of one upstream"),
		durationFlag(flagProbeTimeout, "5s", "timeout of one probe"),
		intFlag(flagProbeSuccessThreshold, 1, "consecutive passing probes that make an upstream healthy"),
		intFlag(flagProbeFailureThreshold, 3, "consecutive failing probes that make an upstream unhealthy"),
		stringFlag(flagLeaseAPIListen, "", "`ADDR` (host:port) to serve the lease API on (empty: off); a non-loopback address needs --lease-api-token-file or --insecure-allow-open"),
		pathFlag(flagLeaseAPITokenFile, "`FILE` holding the lease API's bearer token"),
		stringFlag(flagLeaseAPI, "", "`URLS` (comma-separated) of a controller's lease API to lease upstreams from, sharing cooldowns with every gateway; a call that fails on the connection is retried once on the next URL; the gateway then holds no pool (no --upstream, --upstreams-file, --egress-addr, --probe-url or --lease-api-listen)"),
		pathFlag(flagPoolTokenFile, "`FILE` holding the bearer token for --lease-api"),
		pathFlag(flagPoolSATokenFile, "`FILE` holding a rotating bearer token for --lease-api (a projected service-account token, audience proxyfleet), re-read every 30s; excludes --pool-token-file"),
		stringFlag(flagPoolSelector, "", "default attribute `SELECTOR` (key=value,...) for every lease taken from --lease-api; a key a request names wins"),
		durationFlag(flagPoolOutageGrace, "5m", "while --lease-api (or a Redis --lease-store) does not answer (or answers 5xx), lease from its last-known members for this long after its last answer, then answer 503 pool_unreachable; 0 turns the last-known pool off"),
		durationFlag(flagPoolRefresh, "30s", "how often a --lease-api (or Redis --lease-store) gateway reads the member list (credentials, health, cooldowns) to keep its last-known pool"),
		stringFlag(flagMetricsListen, "127.0.0.1:9090", "`ADDR` (host:port) for /metrics, /healthz, /readyz and, on a loopback address without --status-listen, the status page /status (and /status.json) (empty or \"off\": off)"),
		stringFlag(flagStatusListen, "", "`ADDR` (host:port) serving the status page /status (and /status.json) alone, where --metrics-listen is an address others reach (a sidecar's probe port); a non-loopback address needs --insecure-allow-open (empty: on a loopback --metrics-listen)"),
		durationFlag(flagShutdownGrace, "30s", "on SIGTERM/SIGINT, how long in-flight requests and tunnels may take to finish"),
		durationFlag(flagDialTimeout, "10s", "timeout for connecting to an upstream or a target"),
		durationFlag(flagMemberAnswerTimeout, "15s", "how long a member may take to answer one attempt (a plain request's answer head, the answer to CONNECT); then an idempotent request or a CONNECT tries another member, and the member is asked at once whether it answers anything at all"),
		listFlag(flagSiteAnswerTimeout, "`PATTERN=DURATION` (a host, *.domain or IP, then a duration): --member-answer-timeout for the sites a pattern names, e.g. reports.example.com=90s; repeatable"),
		durationFlag(flagSiteMinInterval, "0s", "least time between two requests to one site through one upstream (0: none); a request waits for its slot, or takes another upstream free sooner"),
		intFlag(flagSiteMaxConcurrency, 0, "most requests to one site in flight across the pool (0: unlimited); a tunnel counts while it opens"),
		listFlag(flagSitePace, "`ENTRY`: PATTERN (a host, *.domain or IP) then min-interval=DURATION and/or max-concurrency=N: --site-min-interval and --site-max-concurrency for the sites a pattern names, e.g. \"*.example.com min-interval=2s max-concurrency=4\"; repeatable"),
		stringFlag(flagPacing, "auto", "`MODE`: auto (before a site bans, one upstream leads and the others trail it; its first 429/ban pauses it for the whole pool and restarts it at what the site served, --pacing-window; answers speed it up again slowly; a quiet site's pace fades, --pacing-memory) or off"),
		durationFlag(flagPacingMaxWait, "30s", "longest a request waits for its slot in a site's pace; then 503 paced with Retry-After"),
		durationFlag(flagPacingWindow, "10s", "with --pacing auto, the longest window of a site's limit the pool is kept from crossing after the site's first ban: the ban pauses the site this long (and a tenth), then each upstream makes what the banned one was served, less one, per window; before it one upstream leads and the others trail it (0: the fixed first cut, 1 request per second per upstream, no pause, no trail)"),
		intFlag(flagPacingIncreaseSteps, rotation.DefaultPaceIncreaseSteps, "with --pacing auto, how many answers without a ban add a cut's rate once more (the rise, never past the rate the site refused)"),
		stringFlag(flagTiers, "", "`NAMES`: the tiers of egress, cheapest first, comma-separated (e.g. own,datacenter,residential); a member's tier is its attribute tier (none: the cheapest). A site's requests start on the cheapest tier and climb one tier after --tier-escalate-bans bans within --tier-escalate-window, probing the tier below after --tier-hold; a client's tier=NAME pins one. Empty: one tier, nothing narrowed (docs/tiers.md)"),
		intFlag(flagTierEscalateBans, rotation.DefaultTierThreshold, "with --tiers, how many bans on a site's tier within --tier-escalate-window move the site one tier up"),
		durationFlag(flagTierEscalateWindow, "10m", "with --tiers, the span --tier-escalate-bans bans must fall in"),
		durationFlag(flagTierHold, "30m", "with --tiers, how long a site stays on the tier it climbed to before one request per --tier-probe-every tries the tier below (doubled for each climb back, up to 24h)"),
		durationFlag(flagTierProbeEvery, "1m", "with --tiers, the least time between two probes of a cheaper tier for one site (at most --tier-hold)"),
		durationFlag(flagPacingMemory, "4h", "with --pacing auto, how slowly a learnt pace fades once its site went 10m without a ban: its interval halves every this long, so a site that banned yesterday is approached carefully today (0: forgotten after the 10m)"),
		durationFlag(flagRequestTimeout, "60s", "how long a plain-HTTP request may take from its arrival to its answer's head, retries included (the answer's body then streams unbounded; tunnels are never cut)"),
		configFileFlag(),
	}, logFlags("text")...)
}

// clusterTargetsUsage is --cluster-target-cidrs' usage, the gateway's and
// the controller's.
const clusterTargetsUsage = "`CIDRS` (comma-separated or repeated): the cluster's own pod and service ranges, admitted as targets although private (sites in the cluster: a test or demo cluster); every other private, loopback and link-local target stays refused. Each must lie inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10 or fc00::/7"

// clusterTargetsFrom reads --cluster-target-cidrs, naming the flag and the
// entry it refuses.
func clusterTargetsFrom(c *cli.Context) ([]netip.Prefix, error) {
	var entries []string
	for _, v := range c.StringSlice(flagClusterTargetCIDRs) {
		entries = append(entries, strings.Split(v, ",")...)
	}
	ps, err := clustertargets.Parse(entries)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagClusterTargetCIDRs, err)
	}
	return ps, nil
}

// gatewayConfig is the gateway's validated configuration, the Config its
// run takes, parsed once so that an error never leaves anything running.
type gatewayConfig struct {
	daemon.Config
	poolToken string // read from --pool-token-file; PoolClient carries it
}

// gatewayNames are the flags the gateway's run names in its errors, logs
// and usage block.
var gatewayNames = daemon.Names{
	Listen:        "--" + flagListen,
	APIListen:     "--" + flagLeaseAPIListen,
	MetricsListen: "--" + flagMetricsListen,
	StatusListen:  "--" + flagStatusListen,
	Static:        "--" + flagUpstream + "/--" + flagEgressAddr,
	UpstreamsFile: "--" + flagUpstreamsFile,
	Probe:         "--" + flagProbeURL,
	OutageGrace:   "--" + flagPoolOutageGrace,
	Clients:       "--" + flagAuthTokenFile,
	APIToken:      "--" + flagLeaseAPITokenFile,
}

// gatewayConfigFrom reads and checks every gateway flag. Errors name the flag
// and never echo a credential.
func gatewayConfigFrom(c *cli.Context) (*gatewayConfig, error) {
	cfg := &gatewayConfig{Config: daemon.Config{
		UpstreamsFile:       c.Path(flagUpstreamsFile),
		AllowPrivateTargets: c.Bool(flagAllowPrivateTargets),
		Names:               gatewayNames,
	}}
	var err error
	if cfg.ClusterTargets, err = clusterTargetsFrom(c); err != nil {
		return nil, err
	}
	for _, read := range []func(*cli.Context) error{cfg.readTimings, cfg.readAnswers, cfg.readMembers, cfg.readPool, cfg.readOutput} {
		if err := read(c); err != nil {
			return nil, err
		}
	}
	// Last: the CA is loaded only once everything else is known good.
	if cfg.MITM, err = mitmFrom(c); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readTimings reads the timeouts, the per-site answer timeouts and the pacing.
func (cfg *gatewayConfig) readTimings(c *cli.Context) (err error) {
	durations := []struct {
		name string
		dst  *time.Duration
	}{
		{flagUpstreamsReload, &cfg.ReloadInterval},
		{flagShutdownGrace, &cfg.ShutdownGrace},
		{flagDialTimeout, &cfg.DialTimeout},
		{flagRequestTimeout, &cfg.RequestTimeout},
		{flagMemberAnswerTimeout, &cfg.AnswerTimeout},
	}
	for _, d := range durations {
		v := c.Duration(d.name)
		if v < 0 || (v == 0 && d.name != flagShutdownGrace) {
			return fmt.Errorf("--%s %s: must be positive", d.name, v)
		}
		*d.dst = v
	}
	if cfg.SiteTimeouts, err = sites.ParseDurations(c.StringSlice(flagSiteAnswerTimeout)); err != nil {
		return fmt.Errorf("--%s: %w", flagSiteAnswerTimeout, err)
	}
	if cfg.Tiers, err = tiersFrom(c); err != nil {
		return err
	}
	if cfg.Pacing, err = pacingFrom(c); err != nil {
		return err
	}
	return nil
}

// readAnswers reads the store's windows and how answers are read: rotation, ban statuses and rules, retries, the sites' roots.
func (cfg *gatewayConfig) readAnswers(c *cli.Context) (err error) {
	if cfg.Store, err = storeOptionsFrom(c); err != nil {
		return err
	}

	if cfg.MaxSessions = int64(c.Int(flagMaxSessions)); cfg.MaxSessions < 1 {
		return fmt.Errorf("--%s %d: must be at least 1", flagMaxSessions, cfg.MaxSessions)
	}
	if cfg.ConnectHTTPPorts, err = sites.ParsePorts(c.String(flagConnectHTTPPorts)); err != nil {
		return fmt.Errorf("--%s: %w", flagConnectHTTPPorts, err)
	}
	if cfg.Mode, err = rotation.ParseMode(c.String(flagRotation)); err != nil {
		return fmt.Errorf("--%s: %w", flagRotation, err)
	}
	if cfg.Classifier.RateLimit, err = rotation.ParseStatusList(c.String(flagRateLimitStatus)); err != nil {
		return fmt.Errorf("--%s: %w", flagRateLimitStatus, err)
	}
	if cfg.Classifier.Ban, err = rotation.ParseStatusList(c.String(flagBanStatus)); err != nil {
		return fmt.Errorf("--%s: %w", flagBanStatus, err)
	}
	if cfg.Classifier.Rules, err = banRulesFrom(c); err != nil {
		return err
	}
	if cfg.BanBodyBytes = c.Int(flagBanBodyBytes); cfg.BanBodyBytes < 1 || cfg.BanBodyBytes > 16<<20 {
		return fmt.Errorf("--%s %d: want 1 to %d", flagBanBodyBytes, cfg.BanBodyBytes, 16<<20)
	}
	if cfg.SiteRoots, err = siteRootsFrom(c); err != nil {
		return err
	}
	if cfg.Retries = c.Int(flagRetries); cfg.Retries < 0 {
		return fmt.Errorf("--%s %d: must be 0 or more", flagRetries, cfg.Retries)
	}
	return nil
}

// readMembers reads the static members and the probe settings (checked even when probing is off, so a typo surfaces before it matters).
func (cfg *gatewayConfig) readMembers(c *cli.Context) (err error) {
	for i, raw := range c.StringSlice(flagUpstream) {
		m, err := pool.ParseUpstream(raw)
		if err != nil {
			// ParseUpstream's message shows the URL with its password masked.
			return fmt.Errorf("--%s (value %d): %w", flagUpstream, i+1, err)
		}
		cfg.Static = append(cfg.Static, m)
	}
	for _, raw := range c.StringSlice(flagEgressAddr) {
		m, err := pool.EgressMember(raw)
		if err != nil {
			return fmt.Errorf("--%s %q: %w", flagEgressAddr, raw, err)
		}
		cfg.Static = append(cfg.Static, m)
	}

	if u := c.String(flagProbeURL); u != "" {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("--%s %s: want an absolute http:// or https:// URL", flagProbeURL, redact.URL(u))
		}
		cfg.Probe = &daemon.ProbeConfig{
			URL:              u,
			Interval:         c.Duration(flagProbeInterval),
			Timeout:          c.Duration(flagProbeTimeout),
			SuccessThreshold: c.Int(flagProbeSuccessThreshold),
			FailureThreshold: c.Int(flagProbeFailureThreshold),
		}
	}
	// Checked even when probing is off, so a typo surfaces before it matters.
	for _, name := range []string{flagProbeInterval, flagProbeTimeout} {
		if d := c.Duration(name); d <= 0 {
			return fmt.Errorf("--%s %s: must be positive", name, d)
		}
	}
	for _, name := range []string{flagProbeSuccessThreshold, flagProbeFailureThreshold} {
		if n := c.Int(name); n < 1 {
			return fmt.Errorf("--%s %d: must be 1 or more", name, n)
		}
	}
	return nil
}

// readPool reads the client tokens and where leases come from: the lease store, or the --lease-api and its outage handling.
func (cfg *gatewayConfig) readPool(c *cli.Context) (err error) {
	if err := cfg.readAuth(c); err != nil {
		return err
	}
	if cfg.PoolAPI, cfg.poolToken, err = poolAPIFrom(c); err != nil {
		return err
	}
	if cfg.LeaseStore, err = leaseStoreFrom(c); err != nil {
		return err
	}
	if cfg.PoolAPI != "" {
		if cfg.PoolClient, err = poolClientFrom(c, cfg.PoolAPI, cfg.poolToken); err != nil {
			return err
		}
	}
	// A lease API and a Redis store can each be away for a while, which
	// the last-known pool rides out; the in-memory store never is.
	if cfg.PoolAPI != "" || cfg.LeaseStore.URL != "" {
		cfg.OutageGrace, cfg.PoolRefresh, err = outageFrom(c)
		return err
	}
	for _, name := range []string{flagPoolOutageGrace, flagPoolRefresh} {
		if c.IsSet(name) {
			return fmt.Errorf("--%s needs --%s or a Redis --%s (the in-memory store is never away)", name, flagLeaseAPI, flagLeaseStore)
		}
	}
	return nil
}

// readOutput reads the metrics address and the log settings.
func (cfg *gatewayConfig) readOutput(c *cli.Context) (err error) {
	switch m := strings.TrimSpace(c.String(flagMetricsListen)); m {
	case "", "off":
	default:
		if _, err := checkListenAddr(flagMetricsListen, m); err != nil {
			return err
		}
		cfg.MetricsListen = m
	}
	if s := strings.TrimSpace(c.String(flagStatusListen)); s != "" {
		loopback, err := checkListenAddr(flagStatusListen, s)
		if err != nil {
			return err
		}
		if !loopback && !c.Bool(flagInsecureAllowOpen) {
			return fmt.Errorf("--%s %s is not loopback: the status page lists the fleet's members and cooldowns without authentication; give a loopback address (kubectl port-forward reaches it in a pod), or --%s",
				flagStatusListen, s, flagInsecureAllowOpen)
		}
		cfg.StatusListen = s
	}

	cfg.LogLevel, cfg.LogJSON, err = readLogFlags(c)
	return err
}

// readAuth reads the token files and applies the never-open-by-accident
// rule to --listen and --lease-api-listen.
func (cfg *gatewayConfig) readAuth(c *cli.Context) error {
	open := c.Bool(flagInsecureAllowOpen)

	cfg.Listen = c.String(flagListen)
	loopback, err := checkListenAddr(flagListen, cfg.Listen)
	if err != nil {
		return err
	}
	if f := c.Path(flagAuthTokenFile); f != "" {
		if cfg.Clients, err = readClientsFile(flagAuthTokenFile, f); err != nil {
			return err
		}
	}
	if !loopback && cfg.Clients == nil && !open {
		return fmt.Errorf("--%s %s is not loopback: set --%s, or --%s to run an open proxy",
			flagListen, cfg.Listen, flagAuthTokenFile, flagInsecureAllowOpen)
	}

	cfg.APIListen = c.String(flagLeaseAPIListen)
	if f := c.Path(flagLeaseAPITokenFile); f != "" {
		if cfg.APIToken, err = readSingleToken(flagLeaseAPITokenFile, f); err != nil {
			return err
		}
	}
	if cfg.APIListen == "" {
		return nil
	}
	loopback, err = checkListenAddr(flagLeaseAPIListen, cfg.APIListen)
	if err != nil {
		return err
	}
	if !loopback && cfg.APIToken == "" && !open {
		return fmt.Errorf("--%s %s is not loopback: set --%s, or --%s to serve the lease API without a token",
			flagLeaseAPIListen, cfg.APIListen, flagLeaseAPITokenFile, flagInsecureAllowOpen)
	}
	return nil
}

// tiersFrom reads the tier flags.
func tiersFrom(c *cli.Context) (tiering.Options, error) {
	var o tiering.Options
	var err error
	if o.Tiers, err = rotation.ParseTiers(c.String(flagTiers)); err != nil {
		return o, fmt.Errorf("--%s: %w", flagTiers, err)
	}
	o.Rule = rotation.TierRule{Threshold: c.Int(flagTierEscalateBans), Window: c.Duration(flagTierEscalateWindow),
		Hold: c.Duration(flagTierHold), ProbeEvery: c.Duration(flagTierProbeEvery)}
	switch {
	case o.Rule.Threshold < 1 || o.Rule.Threshold > rotation.MaxTierThreshold:
		return o, fmt.Errorf("--%s %d: must be 1 to %d", flagTierEscalateBans, o.Rule.Threshold, rotation.MaxTierThreshold)
	case o.Rule.Window <= 0 || o.Rule.Window > rotation.MaxTierHold:
		return o, fmt.Errorf("--%s %s: must be above 0 and at most %s", flagTierEscalateWindow, o.Rule.Window, rotation.MaxTierHold)
	case o.Rule.Hold <= 0 || o.Rule.Hold > rotation.MaxTierHold:
		return o, fmt.Errorf("--%s %s: must be above 0 and at most %s", flagTierHold, o.Rule.Hold, rotation.MaxTierHold)
	case o.Rule.ProbeEvery <= 0 || o.Rule.ProbeEvery > o.Rule.Hold:
		return o, fmt.Errorf("--%s %s: must be above 0 and at most --%s (%s)", flagTierProbeEvery, o.Rule.ProbeEvery, flagTierHold, o.Rule.Hold)
	}
	return o, nil
}

// pacingFrom reads the pacing flags: the default pace, the per-site ones,
// the mode and the longest wait.
func pacingFrom(c *cli.Context) (pacing.Options, error) {
	var o pacing.Options
	if o.Default.MinInterval = c.Duration(flagSiteMinInterval); o.Default.MinInterval < 0 {
		return o, fmt.Errorf("--%s %s: must be 0 or more", flagSiteMinInterval, o.Default.MinInterval)
	}
	if o.Default.MaxConcurrency = c.Int(flagSiteMaxConcurrency); o.Default.MaxConcurrency < 0 {
		return o, fmt.Errorf("--%s %d: must be 0 or more", flagSiteMaxConcurrency, o.Default.MaxConcurrency)
	}
	var err error
	if o.Sites, err = pacing.ParseSitePaces(c.StringSlice(flagSitePace), o.Default); err != nil {
		return o, fmt.Errorf("--%s: %w", flagSitePace, err)
	}
	switch m := c.String(flagPacing); m {
	case "auto":
		o.Auto = true
	case "off":
	default:
		return o, fmt.Errorf("--%s %q: want auto or off", flagPacing, m)
	}
	if o.MaxWait = c.Duration(flagPacingMaxWait); o.MaxWait <= 0 {
		return o, fmt.Errorf("--%s %s: must be positive", flagPacingMaxWait, o.MaxWait)
	}
	o.Rule = rotation.PaceRule{Window: c.Duration(flagPacingWindow), IncreaseSteps: c.Int(flagPacingIncreaseSteps), Memory: c.Duration(flagPacingMemory)}
	switch {
	case o.Rule.Window < 0 || o.Rule.Window > rotation.MaxPaceWindow:
		return o, fmt.Errorf("--%s %s: must be 0 to %s", flagPacingWindow, o.Rule.Window, rotation.MaxPaceWindow)
	case o.Rule.IncreaseSteps < 1 || o.Rule.IncreaseSteps > rotation.MaxPaceIncreaseSteps:
		return o, fmt.Errorf("--%s %d: must be 1 to %d", flagPacingIncreaseSteps, o.Rule.IncreaseSteps, rotation.MaxPaceIncreaseSteps)
	case o.Rule.Memory < 0 || o.Rule.Memory > rotation.MaxPaceMemory:
		return o, fmt.Errorf("--%s %s: must be 0 to %s", flagPacingMemory, o.Rule.Memory, rotation.MaxPaceMemory)
	}
	return o, nil
}
