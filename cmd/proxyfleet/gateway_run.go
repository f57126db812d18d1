package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/internal/logging"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/poolapi"
	"github.com/proxyfleet/proxyfleet/status"
)

// runGateway wires the store, member sources, prober, gateway, lease API and
// metrics server from cfg (in remote pool mode, --pool-api, a lease API
// client instead of the store, sources, prober and API) and serves until ctx
// ends or SIGTERM/SIGINT arrives, then drains for up to the shutdown grace
// and returns nil. Every
// listener is opened before anything starts, so a busy port is an error that
// leaves nothing running.
func runGateway(ctx context.Context, cfg *gatewayConfig, stderr io.Writer) error {
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	if cfg.mitm != nil {
		defer cfg.mitm.CA.Close()
	}
	stderr = logging.Locked(stderr) // shared by the logger and the console trace exporter
	r := &gatewayRun{cfg: cfg, stderr: stderr, log: logging.New(stderr, cfg.logLevel, cfg.logJSON), reg: prometheus.NewRegistry()}
	r.reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	// The status page's chart counts what the recorder counts.
	r.requests = status.NewTimeline(status.TimelineOptions{})
	r.rec = metrics.New(r.reg, r.requests)
	closePool, err := r.openPool()
	if err != nil {
		return err
	}
	defer closePool()
	tr, stopTracing, err := setupTracing(ctx, "proxyfleet-gateway", stderr, r.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	r.tr = tr
	if err := r.build(); err != nil {
		return err
	}
	return r.serve(ctx, stopSignals)
}

// gatewayRun is one run of the gateway command: what runGateway wires, in
// the order it is made.
type gatewayRun struct {
	cfg      *gatewayConfig
	stderr   io.Writer
	log      *slog.Logger
	reg      *prometheus.Registry
	requests *status.Timeline
	rec      *metrics.Metrics
	tr       *tracing.Tracing

	// The pool: the controller's lease API (remote, with its last-known
	// pool) in remote mode, else a store of the gateway's own.
	leases    pool.Pool
	store     pool.LeaseStore
	remote    *poolapi.Client
	lastKnown *lastknown.Pool

	gw      *gateway.Gateway
	srv     *gateway.Server
	members []pool.Member
}

// openPool opens what the gateway leases from (with its scrape-time
// gauges); the returned func closes it.
func (r *gatewayRun) openPool() (func(), error) {
	cfg := r.cfg
	if cfg.poolAPI != "" {
		// gatewayConfigFrom built the client from every --pool-* flag.
		r.remote, r.leases = cfg.poolClient, cfg.poolClient
		if cfg.outageGrace > 0 {
			lk, err := newLastKnown(cfg, r.remote, r.reg, r.log)
			if err != nil {
				return nil, err
			}
			r.lastKnown, r.leases = lk, lk
		}
		return func() {}, nil
	}
	store, closeStore, err := cfg.leaseStore.open(cfg.store, r.log, r.reg)
	if err != nil {
		return nil, err
	}
	r.reg.MustRegister(metrics.NewPoolCollector(store), metrics.NewSiteCooldownCollector(store, 0))
	r.store, r.leases = store, store
	return closeStore, nil
}

// build makes the gateway and the server that runs everything around it.
// The gateway is made before the members are known so that a reload can
// tell it which members left; the server's Reload is the upstreams file's
// OnChange (the file source runs only after srv is set).
func (r *gatewayRun) build() error {
	cfg := r.cfg
	// The pace of sites is the lease store's (the in-process or Redis
	// store), or with --pool-api the controller's, so that every gateway
	// on one store paces a site together.
	var pacer pool.SitePacer
	if r.remote != nil {
		pacer = r.remote
	}
	gw, err := gateway.New(gateway.Options{
		Pool:                r.leases,
		Pacer:               pacer,
		Mode:                cfg.mode,
		LeaseTTL:            cfg.store.DefaultTTL,
		Retries:             cfg.retries,
		Classifier:          cfg.classifier,
		Tokens:              cfg.tokens,
		AllowPrivateTargets: cfg.allowPrivateTargets,
		DialTimeout:         cfg.dialTimeout,
		RequestTimeout:      cfg.requestTimeout,
		MemberAnswerTimeout: cfg.answerTimeout,
		SiteAnswerTimeouts:  cfg.siteTimeouts,
		Pacing:              cfg.pacing,
		BanBodyBytes:        cfg.banBodyBytes,
		SiteRoots:           cfg.siteRoots,
		MITM:                cfg.mitm,
		ConnectHTTPPorts:    cfg.connectHTTPPorts,
		AffinityEntries:     cfg.maxSessions,
		Metrics:             r.rec,
		Logger:              r.log,
		Tracer:              tracing.NewGatewayTracer(r.tr.TracerProvider()),
	})
	if err != nil {
		return err
	}
	r.gw = gw
	r.reg.MustRegister(metrics.NewSitePaceCollector(gw, 0))
	srvOpts := gateway.ServerOptions{Gateway: gw, Store: r.store, Remote: r.remote, RemoteURL: cfg.poolAPI, LastKnown: r.lastKnown, Forget: r.rec, Logger: r.log}
	if r.store != nil {
		reload := func(next []pool.Member) { r.srv.Reload(next) }
		if r.members, srvOpts.Files, srvOpts.Prober, err = localPool(cfg, r.store, reload, r.rec, r.log); err != nil {
			return err
		}
	}
	r.srv, err = gateway.NewServer(srvOpts)
	return err
}

// serve listens, serves until ctx ends or a server fails, then drains for
// up to the shutdown grace. Background work (probes, reloads) stops only
// after the gateway has drained, so the pool stays right for in-flight
// requests.
func (r *gatewayRun) serve(ctx context.Context, stopSignals func()) error {
	cfg, log := r.cfg, r.log
	lns, err := listenAll(map[string]string{
		flagListen:        cfg.listen,
		flagAPIListen:     cfg.apiListen,
		flagMetricsListen: cfg.metricsListen,
	})
	if err != nil {
		return err
	}
	proxyLn, apiLn, metricsLn := lns[flagListen], lns[flagAPIListen], lns[flagMetricsListen]
	bgCtx, stopBackground := context.WithCancel(context.Background())
	bgDone := make(chan struct{})
	go func() {
		defer close(bgDone)
		r.srv.Run(bgCtx)
	}()
	defer func() {
		stopBackground()
		<-bgDone
	}()
	serveErr := make(chan error, 3)
	go func() { serveErr <- serveErrOf(flagListen, r.gw.Serve(proxyLn)) }()
	var ready metrics.Readiness
	httpServers := r.serveHTTP(apiLn, metricsLn, &ready, serveErr)
	ready.Serving()
	r.started(proxyLn, apiLn, metricsLn)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace", cfg.shutdownGrace.String())
	case runErr = <-serveErr:
		log.Error("server failed; shutting down", "err", runErr)
	}
	stopSignals() // a second signal kills the process at once
	ready.Stopping()
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdownGrace)
	defer cancel()
	if err := r.gw.Shutdown(drainCtx); err != nil {
		log.Warn("shutdown grace ran out; open connections were closed", "grace", cfg.shutdownGrace.String(), "err", err)
	}
	for _, hs := range httpServers {
		if err := hs.Shutdown(drainCtx); err != nil {
			_ = hs.Close()
		}
	}
	log.Info("stopped")
	return runErr
}

// serveHTTP serves the lease API (when listened for) and the metrics and
// status page, and returns their servers in the order they drain: the
// metrics server last, so /readyz answers 503 while everything else drains.
func (r *gatewayRun) serveHTTP(apiLn, metricsLn net.Listener, ready *metrics.Readiness, serveErr chan<- error) []*http.Server {
	var servers []*http.Server
	if apiLn != nil {
		if r.cfg.apiToken == "" {
			r.log.Warn("lease API has no token (--api-token-file): any process that can reach it can lease and report", "addr", apiLn.Addr().String())
		}
		api := &http.Server{
			Handler:           tracing.Handler(poolapi.NewAPIServer(r.store, poolapi.APIOptions{Token: r.cfg.apiToken, Logger: r.log, Recorder: r.rec}), r.tr.TracerProvider(), "leaseapi"),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          logging.ServerErrorLog(r.log),
		}
		servers = append(servers, api)
		go func() { serveErr <- serveErrOf(flagAPIListen, api.Serve(apiLn)) }()
	}
	if metricsLn != nil {
		// The metrics address also serves the status page, read from srv.
		handler := status.GatewayHandler(status.GatewayOptions{Pool: r.srv, PoolAPI: r.cfg.poolAPI, Requests: r.requests,
			Paces: r.gw.PaceStatus, Next: metrics.Handler(r.reg, ready.Ready)})
		ms := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: logging.ServerErrorLog(r.log)}
		servers = append(servers, ms)
		go func() { serveErr <- serveErrOf(flagMetricsListen, ms.Serve(metricsLn)) }()
	}
	return servers
}

// started prints the usage block (text logs) and logs the start record,
// which carries every address the block prints: with JSON logs it is the
// only place they are written.
func (r *gatewayRun) started(proxyLn, apiLn, metricsLn net.Listener) {
	cfg := r.cfg
	if !cfg.logJSON { // JSON logs are read by machines: every line on stderr is a record
		printUsage(r.stderr, cfg, r.members, proxyLn, apiLn, metricsLn)
	}
	started := []any{"listen", proxyLn.Addr().String()}
	if apiLn != nil {
		started = append(started, "apiListen", apiLn.Addr().String())
	}
	if metricsLn != nil {
		started = append(started, "metricsListen", metricsLn.Addr().String())
	}
	started = append(started, "rotation", string(cfg.mode), "auth", len(cfg.tokens) > 0)
	if r.remote != nil {
		r.log.Info("gateway started", append(started, "poolAPI", cfg.poolAPI, "outageGrace", cfg.outageGrace.String())...)
		return
	}
	r.log.Info("gateway started", append(started, "members", len(r.members), "probes", cfg.probe != nil, "mitm", cfg.mitm != nil)...)
}

// localPool loads the members of a gateway that holds its own pool (the
// upstreams file, --upstream, --egress-addr, or direct egress) into store,
// and builds the file source (calling reload on a change) and the prober
// when configured; neither runs yet.
func localPool(cfg *gatewayConfig, store pool.LeaseStore, reload func([]pool.Member), rec *metrics.Metrics, log *slog.Logger) (
	[]pool.Member, *pool.FileSource, *pool.Prober, error) {
	var (
		members    []pool.Member
		fileSource *pool.FileSource
		err        error
	)
	switch {
	case cfg.upstreamsFile != "":
		fileSource = pool.NewFileSource(cfg.upstreamsFile, pool.FileSourceOptions{
			Static:   cfg.static,
			Interval: cfg.reloadInterval,
			OnChange: reload,
			OnError: func(err error) {
				log.Error("upstreams file rejected; keeping the current members", "err", err)
			},
		})
		if members, err = fileSource.Load(); err != nil {
			return nil, nil, nil, fmt.Errorf("--%s: %w", flagUpstreamsFile, err)
		}
		if len(members) == 0 {
			log.Warn("no members: every request gets 503 until the upstreams file lists one", "file", cfg.upstreamsFile)
		}
	case len(cfg.static) > 0:
		if members, err = pool.MergeMembers(cfg.static, nil); err != nil {
			return nil, nil, nil, fmt.Errorf("--%s/--%s: %w", flagUpstream, flagEgressAddr, err)
		}
	default:
		// Nothing configured: the gateway works on a fresh machine. A
		// configured but empty upstreams file never falls back to this, so a
		// crawler meant to go through proxies never leaves from this host.
		members = []pool.Member{pool.DirectMember()}
	}
	store.SetMembers(members)

	p := cfg.probe
	if p == nil {
		return members, fileSource, nil, nil
	}
	prober, err := pool.NewProber(func() []pool.Member { return memberList(store.Members()) }, store, pool.ProberOptions{
		URL:              p.url,
		Interval:         p.interval,
		Timeout:          p.timeout,
		SuccessThreshold: p.successThreshold,
		FailureThreshold: p.failureThreshold,
		Recorder:         rec,
		Logger:           log,
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--%s: %w", flagProbeURL, err)
	}
	return members, fileSource, prober, nil
}

// newLastKnown wraps the lease API client in the last-known pool that rides
// out its outages, with its outage metrics.
func newLastKnown(cfg *gatewayConfig, remote *poolapi.Client, reg prometheus.Registerer, log *slog.Logger) (*lastknown.Pool, error) {
	var lk *lastknown.Pool
	rec := metrics.NewPoolOutages(reg, func() (bool, bool) {
		st := lk.Status()
		return st.Down, st.Refusing
	})
	lk, err := lastknown.New(lastknown.Options{
		Remote:   remote,
		Grace:    cfg.outageGrace,
		Refresh:  cfg.poolRefresh,
		Store:    cfg.store,
		Recorder: rec,
		Logger:   log.With("poolAPI", cfg.poolAPI),
	})
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagPoolOutageGrace, err)
	}
	return lk, nil
}

// memberList strips the status from a member listing.
func memberList(st []pool.MemberStatus) []pool.Member {
	out := make([]pool.Member, len(st))
	for i, m := range st {
		out[i] = m.Member
	}
	return out
}

// listenAll opens a listener per non-empty address, keyed by flag name, or
// closes what it opened and returns an error naming the flag and address.
func listenAll(addrs map[string]string) (map[string]net.Listener, error) {
	lns := map[string]net.Listener{}
	for _, name := range []string{flagListen, flagAPIListen, flagMetricsListen} {
		addr := addrs[name]
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll(lns)
			return nil, fmt.Errorf("--%s %s: cannot listen: %w", name, addr, err)
		}
		lns[name] = ln
	}
	return lns, nil
}

func closeAll(lns map[string]net.Listener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// serveErrOf turns a Serve return into nil for a normal shutdown, or an error
// naming the listener that failed.
func serveErrOf(flagName string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("--%s: %w", flagName, err)
}

// printUsage tells the person who just started the gateway how to use it.
// It shows where the token goes, never a token.
func printUsage(w io.Writer, cfg *gatewayConfig, members []pool.Member, proxyLn, apiLn, metricsLn net.Listener) {
	addr := reachableAddr(proxyLn.Addr())
	proxyURL := "http://" + addr
	if len(cfg.tokens) > 0 {
		proxyURL = "http://crawler:$TOKEN@" + addr
	}
	names := make([]string, 0, len(members))
	for i, m := range members {
		if i == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(members)-5))
			break
		}
		names = append(names, m.Name)
	}
	noun := "members"
	if len(members) == 1 {
		noun = "member"
	}
	var b strings.Builder
	if cfg.poolAPI != "" {
		fmt.Fprintf(&b, "proxyfleet gateway listening on %s leasing from the pool API %s, rotation %s\n",
			proxyLn.Addr(), cfg.poolAPI, cfg.mode)
	} else {
		fmt.Fprintf(&b, "proxyfleet gateway listening on %s with %d %s (%s), rotation %s\n",
			proxyLn.Addr(), len(members), noun, strings.Join(names, ", "), cfg.mode)
	}
	if len(cfg.tokens) > 0 {
		fmt.Fprintf(&b, "  TOKEN=<a token from --%s>\n", flagAuthTokenFile)
	}
	fmt.Fprintf(&b, "  export HTTPS_PROXY=%s HTTP_PROXY=%s\n", proxyURL, proxyURL)
	fmt.Fprintf(&b, "  curl -x %s https://example.com\n", proxyURL)
	user := "crawler"
	if len(cfg.tokens) > 0 {
		user += "-session-s1:$TOKEN"
	} else {
		user += "-session-s1:"
	}
	fmt.Fprintf(&b, "  curl -x http://%s -U '%s' https://example.com   # pin a session\n", addr, user)
	if apiLn != nil {
		fmt.Fprintf(&b, "  lease API: http://%s/v1/proxies   (proxyfleet lease list --api http://%s)\n",
			reachableAddr(apiLn.Addr()), reachableAddr(apiLn.Addr()))
	}
	if metricsLn != nil {
		fmt.Fprintf(&b, "  metrics:   http://%s/metrics\n", reachableAddr(metricsLn.Addr()))
		fmt.Fprintf(&b, "  status:    http://%s/status\n", reachableAddr(metricsLn.Addr()))
	}
	_, _ = io.WriteString(w, b.String())
}

// reachableAddr is a listener's address as a local client would dial it: an
// unspecified host (0.0.0.0, ::) becomes loopback.
func reachableAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		if tcp.IP != nil && tcp.IP.To4() == nil {
			return net.JoinHostPort("::1", fmt.Sprint(tcp.Port))
		}
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return tcp.String()
}
