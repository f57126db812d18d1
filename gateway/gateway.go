package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/admission"
	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/health"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// Defaults of Options' zero values (Retries has no zero-value default: 0
// means no retries, and DefaultRetries is what the CLI flag starts at).
const (
	DefaultLeaseTTL    = 60 * time.Second // sticky lease lifetime
	DefaultRetries     = 2                // the --retries flag's default
	DefaultDialTimeout = 10 * time.Second // per dial, CONNECT answer included
	// DefaultTunnelIdleAfter: a tunnel direction still waiting for its
	// source this long after its relay started (or last woke) gives its
	// goroutine up until the source is readable (Linux). A busy direction
	// is so parked and woken at once at most once per period, a few system
	// calls; short against how long crawlers keep tunnels open between
	// requests, so the idle ones cost their sockets only.
	DefaultTunnelIdleAfter = time.Second
	DefaultRequestTimeout  = 60 * time.Second // plain HTTP, up to the answer's head
	// DefaultMemberAnswerTimeout is how long a member may take to answer
	// one attempt. Sites that crawls meet answer within seconds; one that
	// needs longer gets its own (SiteAnswerTimeouts), so a silent member
	// costs a request 15s and a retry, not the whole request deadline.
	DefaultMemberAnswerTimeout = 15 * time.Second
	DefaultAffinityEntries     = 100_000 // (session, target) pins kept
)

// Directions passed to Recorder.BytesRelayed.
const (
	DirectionUp   = "up"   // client → target
	DirectionDown = "down" // target → client
)

// Legs passed to Recorder.MITMHandshake.
const (
	LegClient = "client" // the client's TLS handshake with the gateway
	LegSite   = "site"   // the gateway's with the site, on a mirroring tunnel's own connection
)

// FallbackUnmirrorable is the Recorder.MITMHelloFallback reason of a
// ClientHello that cannot be mirrored at all (it does not parse, or
// carries an extension uTLS cannot send).
const FallbackUnmirrorable = "unmirrorable"

const (
	// serverMaxHeaderBytes matches Squid's request_header_max_size; larger
	// request heads get net/http's 431.
	serverMaxHeaderBytes = sitelink.ClientHeadMax
	serverReadHeader     = 30 * time.Second
	serverIdleTimeout    = 2 * time.Minute
	// poolCallTimeout bounds a Report or Release made after the client left
	// (remote pools only; the in-process store never blocks).
	poolCallTimeout = 5 * time.Second
	// tunnelUnwindWait bounds how long a forced Shutdown waits for the
	// relays of the tunnels it closed to return.
	tunnelUnwindWait = time.Second
)

// Recorder receives the gateway's metrics; cmd/proxyfleet backs it with
// Prometheus. Calls are made on the request path and must be cheap.
type Recorder interface {
	// Request counts one finished client request (or CONNECT tunnel) by the
	// member that served it ("" when none) and its outcome (the fault.Outcome* values).
	Request(member, outcome string, d time.Duration)
	// UpstreamFailure counts one failed use of a member (dial, CONNECT answer, transport error).
	UpstreamFailure(member string)
	// BytesRelayed counts payload bytes in one direction (DirectionUp or DirectionDown).
	BytesRelayed(direction string, n int64)
	// MITMHandshake counts one completed TLS handshake of an intercepted
	// tunnel on one leg (LegClient or LegSite) and whether it resumed a
	// session: under mirror the site leg resumes where the client did.
	MITMHandshake(leg string, resumed bool)
	// MITMHelloFallback counts one tunnel whose site connections stopped
	// mirroring its client's ClientHello and sent a preset instead, by why:
	// FallbackUnmirrorable, or a mirror.OwnReasons value (the site
	// handshake with the mirrored hello failed on the gateway's side).
	MITMHelloFallback(reason string)
}

// Resolver looks up a target's addresses; *net.Resolver implements it, and
// tests inject fixed answers.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configures a Gateway. Only Pool is required.
type Options struct {
	// Pool hands out members: the in-process *pool.Store or a lease API *leaseapi.Client.
	Pool pool.Pool
	// Mode is the default rotation (rotation.ModeSticky when empty); a
	// client's rotate= parameter overrides it per request.
	Mode rotation.Mode
	// LeaseTTL is how long a sticky (session, target) keeps its member when
	// the client gives no sessttl (default 60s).
	LeaseTTL time.Duration
	// Retries is how many times an idempotent request without a body is
	// replayed on another member after a ban answer or an upstream failure;
	// 0 means none (the CLI default is DefaultRetries). CONNECT dials are
	// retried while members remain, whatever this says.
	Retries int
	// Classifier reads statuses as ban signals; when both lists are nil,
	// rotation.DefaultClassifier(). Empty non-nil lists turn a signal off.
	Classifier rotation.Classifier
	// Clients are the token clients (--auth-token-file): each request must
	// carry one's token (Proxy-Authorization: Basic user:token) and leases
	// only what its line allows; empty means no client authentication.
	Clients []clients.Client
	// Quotas keeps the token clients' quotas (their lines' leases=, rps=,
	// site-rps=): the lease store, so a quota holds across the gateways
	// on it. Nil: a client with a quota is an error of New.
	Quotas pool.QuotaKeeper
	// AllowPrivateTargets lets clients reach loopback, private, link-local
	// and unique-local addresses (tests, trusted networks).
	AllowPrivateTargets bool
	// ClusterTargets are private ranges clients may reach although the
	// rest of the private ranges stays refused: the cluster's own pod and
	// service CIDRs, for sites in the cluster (clustertargets.Parse checks
	// them; New refuses what it would refuse).
	ClusterTargets []netip.Prefix
	// Resolver resolves target names for the private-range check and for
	// direct members; nil is net.DefaultResolver.
	Resolver Resolver
	// DialTimeout bounds each dial of an upstream or target, including an
	// upstream's answer to CONNECT (default 10s).
	DialTimeout time.Duration
	// TunnelIdleAfter is how long after its relay started (or last woke) a
	// tunnel direction that is waiting for its source is parked without a
	// goroutine (default DefaultTunnelIdleAfter; Linux only); tests
	// shorten it.
	TunnelIdleAfter time.Duration
	// RequestTimeout bounds a plain-HTTP request from its arrival until the
	// response head, retries included (default 60s). Streaming the body is
	// not bounded by it; CONNECT tunnels are never cut by it.
	RequestTimeout time.Duration
	// MemberAnswerTimeout bounds one attempt through a member from the
	// request written (for CONNECT: sent) to the first of its answer, the
	// head of a plain request's answer or the answer to CONNECT (default
	// DefaultMemberAnswerTimeout). When it passes, an idempotent request or
	// a CONNECT tries another member within RequestTimeout; the member is
	// checked at once for whether it answers anything at all (aliveness).
	MemberAnswerTimeout time.Duration
	// SiteAnswerTimeouts replace MemberAnswerTimeout for the sites they name.
	SiteAnswerTimeouts sites.Durations
	// Metrics receives counters; nil records nothing.
	Metrics Recorder
	// Logger gets failures (Warn) and per-request detail (Debug); nil discards.
	Logger *slog.Logger
	// AffinityEntries is the most live sticky sessions, (session, target)
	// pins, the gateway holds (default 100k): a new one beyond it is
	// answered 503 session_limit, and a live one is never evicted.
	AffinityEntries int64
	// BrokenMemberSites and BrokenMemberWindow size rotation.MemberEvidence:
	// a member that fails this many distinct sites within the window, each
	// reached by another member right after, and serves nothing in between,
	// is out for every site (defaults 3 and 1m).
	BrokenMemberSites  int
	BrokenMemberWindow time.Duration
	// BanBodyBytes is how much of a body ban rules search (read ahead only
	// when a rule needs it); 0 is rotation.DefaultBanBodyBytes.
	BanBodyBytes int
	// SiteRoots verify sites' certificates on the gateway's own TLS to them
	// (MITM'd tunnels and https:// absolute URIs); nil is the system roots.
	SiteRoots *x509.CertPool
	// MITM, when set, intercepts CONNECT tunnels: see MITMOptions.
	MITM *MITMOptions
	// ConnectHTTPPorts are the ports whose CONNECT tunnels the gateway
	// answers itself and reads as plain HTTP (browsers send ws:// so);
	// nil is sites.DefaultConnectHTTPPorts, an empty slice none.
	ConnectHTTPPorts []uint16
	// Tracer receives every request at its end; nil traces nothing.
	Tracer RequestTracer
	// Pacing is how fast requests go to each site; the zero value paces
	// nothing (the CLI turns the automatic slow-down on by default).
	Pacing pacing.Options
	// FailureWindow is how long a member the gateway reported failed
	// rests (the lease store's --failure-cooldown), so how long the
	// gateway asks a silent one whether it is back (default
	// pool.DefaultFailureWindow).
	FailureWindow time.Duration
	// Pacer is where the pace of sites is decided and kept: a lease
	// store's (the Redis store, the lease API client), so that every
	// gateway on it paces a site together. Nil is Pool's when it is a
	// pool.SitePacer, else a pace of this gateway's own.
	Pacer pool.SitePacer
	// Tiers is the tier stage (tiering.Options): the order of the tiers
	// and how a site climbs them; fewer than two tiers (the zero value)
	// narrow nothing. Where a site starts is kept by Pool when it is a
	// pool.SiteTierKeeper, else by this gateway alone.
	Tiers tiering.Options
	// TierKeeper is where the sites' places on the tiers are kept: a lease
	// store's (the Redis store, the lease API client), so every gateway on
	// it starts a site where one learnt to. Nil is Pool's when it is a
	// pool.SiteTierKeeper, else a place of this gateway's own.
	TierKeeper pool.SiteTierKeeper
}

// Gateway is the forward proxy. Create it with New; serve it with Serve (or
// mount it as an http.Handler) and stop it with Shutdown. It is wiring:
// the stages of the request path are made here from Options and handed
// to each other (requestPath, path.go, reads the path top-down); Gateway
// itself serves, shuts down and reports status.
type Gateway struct {
	front  *front.Server
	path   *requestPath
	inner  *inner
	admit  *admission.Admission
	leases *leasing
	pacer  *pacing.Pacer
	health *health.Health
	links  *memberLinks
}

// withDefaults checks o and fills in the defaults of its zero values.
func (o Options) withDefaults() (Options, error) {
	if o.Pool == nil {
		return Options{}, errors.New("gateway: Options.Pool is required")
	}
	switch o.Mode {
	case "":
		o.Mode = rotation.ModeSticky
	case rotation.ModeSticky, rotation.ModeRequest:
	default:
		return Options{}, errors.New("gateway: Options.Mode " + strconv.Quote(string(o.Mode)) + " is not sticky or request")
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"LeaseTTL", &o.LeaseTTL, DefaultLeaseTTL},
		{"DialTimeout", &o.DialTimeout, DefaultDialTimeout},
		{"TunnelIdleAfter", &o.TunnelIdleAfter, DefaultTunnelIdleAfter},
		{"RequestTimeout", &o.RequestTimeout, DefaultRequestTimeout},
		{"MemberAnswerTimeout", &o.MemberAnswerTimeout, DefaultMemberAnswerTimeout},
	} {
		if *d.v < 0 {
			return Options{}, errors.New("gateway: Options." + d.name + " is negative")
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.Retries < 0 {
		return Options{}, errors.New("gateway: Options.Retries is negative")
	}
	if o.BrokenMemberSites < 0 || o.BrokenMemberWindow < 0 {
		return Options{}, errors.New("gateway: Options.BrokenMemberSites and BrokenMemberWindow must not be negative")
	}
	if o.AffinityEntries < 0 {
		return Options{}, errors.New("gateway: Options.AffinityEntries is negative")
	}
	if o.AffinityEntries == 0 {
		o.AffinityEntries = DefaultAffinityEntries
	}
	if o.BanBodyBytes < 0 {
		return Options{}, errors.New("gateway: Options.BanBodyBytes is negative")
	}
	if o.BanBodyBytes == 0 {
		o.BanBodyBytes = rotation.DefaultBanBodyBytes
	}
	if o.Classifier.RateLimit == nil && o.Classifier.Ban == nil {
		o.Classifier = rotation.DefaultClassifier()
	}
	for i, c := range o.Clients {
		if c.Token == "" || c.Name == "" {
			return Options{}, errors.New("gateway: Options.Clients[" + strconv.Itoa(i) + "] has an empty name or token")
		}
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.Metrics == nil {
		o.Metrics = nopRecorder{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// New validates o, fills defaults and returns a Gateway ready to serve.
func New(o Options) (*Gateway, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	g := &Gateway{admit: admission.New(admission.Options{Clients: o.Clients, AllowPrivate: o.AllowPrivateTargets, Cluster: o.ClusterTargets, Resolver: o.Resolver}), health: health.New(health.Options{Pool: o.Pool, Recorder: o.Metrics, Logger: o.Logger, DialTimeout: o.DialTimeout,
		FailureWindow: o.FailureWindow, BrokenMemberSites: o.BrokenMemberSites, BrokenMemberWindow: o.BrokenMemberWindow})}
	g.links = newMemberLinks(o, g.admit)
	if g.leases, err = newLeasing(o, g.links, g.health); err != nil {
		return nil, err
	}
	if o.Pacing.MaxWait < 0 {
		return nil, errors.New("gateway: Options.Pacing.MaxWait is negative")
	}
	if o.Pacing.Default.MinInterval < 0 || o.Pacing.Default.MaxConcurrency < 0 {
		return nil, errors.New("gateway: Options.Pacing.Default must not be negative")
	}
	if err := clustertargets.Check(o.ClusterTargets); err != nil {
		return nil, fmt.Errorf("gateway: Options.ClusterTargets: %w", err)
	}
	sp := o.Pacer
	if sp == nil {
		sp, _ = o.Pool.(pool.SitePacer)
	}
	g.pacer = pacing.New(o.Pacing, sp, o.Logger)
	if err := o.Tiers.Check(); err != nil {
		return nil, fmt.Errorf("gateway: Options.Tiers: %w", err)
	}
	for _, c := range o.Clients {
		if c.Tiers == nil {
			continue
		}
		rg, err := o.Tiers.Range(c.Tiers)
		if err != nil {
			return nil, fmt.Errorf("gateway: client %s (line %d): %w", c.Name, c.Line, err)
		}
		if o.Tiers.Clients == nil {
			o.Tiers.Clients = map[string]rotation.TierRange{}
		}
		o.Tiers.Clients[c.Name] = rg
	}
	keeper := o.TierKeeper
	if keeper == nil {
		keeper, _ = o.Pool.(pool.SiteTierKeeper)
	}
	tiers := tiering.New(o.Tiers, keeper, o.Logger)
	var m *mitm
	if o.MITM != nil {
		if m, err = newMITM(o.MITM); err != nil {
			return nil, err
		}
	}
	rp := &requestPath{
		admit: g.admit, leases: g.leases, pacer: g.pacer, tiers: tiers, health: g.health, mitm: m,
		ex:      newExchange(o, g.links, m),
		exit:    &finisher{rec: o.Metrics, tracer: o.Tracer, log: o.Logger, pace: g.pacer, leases: g.leases, health: g.health},
		retries: o.Retries, classifier: o.Classifier, requestTimeout: o.RequestTimeout, dialTimeout: o.DialTimeout,
		tunnelIdle: o.TunnelIdleAfter, connectHTTPPorts: o.ConnectHTTPPorts, rec: o.Metrics, log: o.Logger,
	}
	if rp.connectHTTPPorts == nil {
		rp.connectHTTPPorts = sites.DefaultConnectHTTPPorts
	}
	fo := frontOptions(o.Metrics, o.Logger)
	g.front = front.New(g.ServeHTTP, fo)
	rp.inner = newInner(rp.serveInnerRequest, fo, o.Logger)
	g.path, g.inner = rp, rp.inner
	return g, nil
}

// frontOptions are the options of the gateway's own HTTP/1.1 servers: the
// proxy port's and the one inside MITM'd tunnels.
func frontOptions(rec Recorder, log *slog.Logger) front.Options {
	return front.Options{
		MaxHeaderBytes: serverMaxHeaderBytes, ReadHeaderTimeout: serverReadHeader, IdleTimeout: serverIdleTimeout,
		RejectHeader: HeaderReason + ": " + fault.ReasonBadRequest + "\r\nProxy-Status: " + fault.ProxyStatus(fault.ReasonBadRequest),
		Rejected: func(r front.Rejection, start time.Time) {
			rec.Request("", rejectionOutcome[r], time.Since(start))
		},
		Logger: log,
	}
}

// Serve accepts proxy connections on ln until Shutdown; it returns
// http.ErrServerClosed then. It may be called for several listeners.
func (g *Gateway) Serve(ln net.Listener) error {
	g.admit.Listening(ln.Addr())
	return g.front.Serve(ln)
}

// Shutdown stops accepting, then waits for in-flight requests and open
// CONNECT tunnels until ctx ends; whatever is left then is closed (its
// relays get up to a second to unwind) and ctx's error returned. It
// returns nil when everything finished in time.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.health.Stop()
	err := g.front.Shutdown(ctx)
	// Requests inside tunnels the gateway answered drain like plain ones.
	if ierr := g.inner.shutdown(ctx); err == nil {
		err = ierr
	}
	if err == nil {
		err = g.path.tunnels.Wait(ctx)
	}
	if err != nil {
		g.front.Close()
		g.path.tunnels.CloseAll()
		// The relays of the closed tunnels return at once; wait for them
		// (briefly) so their bytes and leases are settled when we return.
		unwind, cancel := context.WithTimeout(context.Background(), tunnelUnwindWait)
		_ = g.path.tunnels.Wait(unwind)
		cancel()
	}
	g.links.closeAll()
	g.leases.close()
	g.pacer.Close()
	return err
}

// ServeHTTP handles one proxy request: CONNECT or an absolute-URI HTTP request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.path.serve(w, r) }

// ForgetMember drops the gateway's state for a member removed from the pool
// and closes its idle keep-alive connections. Pins to it are abandoned: the
// next request of those sessions leases afresh. Open tunnels are untouched.
func (g *Gateway) ForgetMember(name string) { g.links.forget(name) }

// ForgetIdleMembers forgets (as ForgetMember does) every member no request
// has taken for longer than idle, and returns their names. A gateway whose
// members come from a remote lease API never hears that one left the pool,
// so without this its per-member state would only grow; a member still in
// the pool is simply set up again on its next use.
func (g *Gateway) ForgetIdleMembers(idle time.Duration) []string { return g.links.forgetIdle(idle) }

// PaceStatus lists the sites the pacer keeps (those with a pace of some
// kind that had requests), most held first (queued, then waited and
// refused), for the status page and the metrics. The learnt pace is as
// the store last told this gateway; the counts are this gateway's.
func (g *Gateway) PaceStatus() []statuspage.SitePace { return g.pacer.Status() }

// FailureRestOverrides reports the latest episode of leases of members
// resting for their own failures.
func (g *Gateway) FailureRestOverrides() health.OverrideStatus { return g.health.OverrideStatus() }

// bgCtx returns ctx while it is alive, else a detached context with a short
// deadline, so a Report or Release still lands after the client went away.
func bgCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), poolCallTimeout)
}

type nopRecorder struct{}

func (nopRecorder) Request(string, string, time.Duration) {}
func (nopRecorder) UpstreamFailure(string)                {}
func (nopRecorder) BytesRelayed(string, int64)            {}
func (nopRecorder) MITMHandshake(string, bool)            {}
func (nopRecorder) MITMHelloFallback(string)              {}

// selectorString renders attribute selectors as sorted k=v pairs for messages.
func selectorString(sel map[string]string) string {
	pairs := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		pairs = append(pairs, k+"="+sel[k])
	}
	return strings.Join(pairs, ",")
}
