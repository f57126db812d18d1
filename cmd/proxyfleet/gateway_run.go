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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

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
	log := logging.New(stderr, cfg.logLevel, cfg.logJSON)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The status page's chart counts what the recorder counts.
	requests := status.NewTimeline(status.TimelineOptions{})
	rec := metrics.New(reg, requests)

	// The pool: the controller's lease API in remote mode, else a store of
	// our own (with its scrape-time gauges).
	var (
		leases    pool.Pool
		store     pool.LeaseStore
		remote    *poolapi.Client
		lastKnown *lastknown.Pool
		err       error
	)
	if cfg.poolAPI != "" {
		if remote = cfg.poolClient; remote == nil {
			if remote, err = poolapi.NewClient(cfg.poolAPI, cfg.poolToken, nil); err != nil {
				return fmt.Errorf("--%s: %w", flagPoolAPI, err)
			}
		}
		leases = remote
		if cfg.outageGrace > 0 {
			if lastKnown, err = newLastKnown(cfg, remote, reg, log); err != nil {
				return err
			}
			leases = lastKnown
		}
	} else {
		var closeStore func()
		if store, closeStore, err = cfg.leaseStore.open(cfg.store, log); err != nil {
			return err
		}
		defer closeStore()
		reg.MustRegister(metrics.NewPoolCollector(store), metrics.NewSiteCooldownCollector(store, 0))
		leases = store
	}

	tr, stopTracing, err := setupTracing(ctx, "proxyfleet-gateway", stderr, log)
	if err != nil {
		return err
	}
	defer stopTracing()

	// The gateway is created before the members are known so that a reload
	// can tell it which members left.
	gw, err := gateway.New(gateway.Options{
		Pool:                leases,
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
		Metrics:             rec,
		Logger:              log,
		Tracer:              tracing.NewGatewayTracer(tr.TracerProvider()),
	})
	if err != nil {
		return err
	}
	reg.MustRegister(metrics.NewSitePaceCollector(gw, 0))

	// The server runs everything around the gateway; its Reload is the
	// upstreams file's OnChange (the file source runs only after srv is set).
	var (
		srv     *gateway.Server
		members []pool.Member
	)
	srvOpts := gateway.ServerOptions{Gateway: gw, Store: store, Remote: remote, RemoteURL: cfg.poolAPI, LastKnown: lastKnown, Forget: rec, Logger: log}
	if store != nil {
		reload := func(next []pool.Member) { srv.Reload(next) }
		if members, srvOpts.Files, srvOpts.Prober, err = localPool(cfg, store, reload, rec, log); err != nil {
			return err
		}
	}
	if srv, err = gateway.NewServer(srvOpts); err != nil {
		return err
	}

	lns, err := listenAll(map[string]string{
		flagListen:        cfg.listen,
		flagAPIListen:     cfg.apiListen,
		flagMetricsListen: cfg.metricsListen,
	})
	if err != nil {
		return err
	}
	proxyLn, apiLn, metricsLn := lns[flagListen], lns[flagAPIListen], lns[flagMetricsListen]

	// Background work stops only after the gateway has drained, so probes
	// and reloads keep the pool right for in-flight requests.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	bgDone := make(chan struct{})
	go func() {
		defer close(bgDone)
		srv.Run(bgCtx)
	}()
	defer func() {
		stopBackground()
		<-bgDone
	}()

	serveErr := make(chan error, 3)
	go func() { serveErr <- serveErrOf(flagListen, gw.Serve(proxyLn)) }()
	var httpServers []*http.Server
	if apiLn != nil {
		if cfg.apiToken == "" {
			log.Warn("lease API has no token (--api-token-file): any process that can reach it can lease and report", "addr", apiLn.Addr().String())
		}
		srv := &http.Server{
			Handler:           tracing.Handler(poolapi.NewAPIServer(store, poolapi.APIOptions{Token: cfg.apiToken, Logger: log, Recorder: rec}), tr.TracerProvider(), "leaseapi"),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          logging.ServerErrorLog(log),
		}
		httpServers = append(httpServers, srv)
		go func() { serveErr <- serveErrOf(flagAPIListen, srv.Serve(apiLn)) }()
	}
	var ready metrics.Readiness
	// The metrics address also serves the status page, read from srv.
	metricsHandler := status.GatewayHandler(status.GatewayOptions{Pool: srv, PoolAPI: cfg.poolAPI, Requests: requests, Paces: gw.PaceStatus, Next: metrics.Handler(reg, ready.Ready)})
	if metricsLn != nil {
		srv := &http.Server{Handler: metricsHandler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: logging.ServerErrorLog(log)}
		// Last in the list: /readyz answers 503 while everything else drains.
		httpServers = append(httpServers, srv)
		go func() { serveErr <- serveErrOf(flagMetricsListen, srv.Serve(metricsLn)) }()
	}
	ready.Serving()
	if !cfg.logJSON { // JSON logs are read by machines: every line on stderr is a record
		printUsage(stderr, cfg, members, proxyLn, apiLn, metricsLn)
	}
	// The start record carries every address the usage block prints, since
	// with JSON logs it is the only place they are written.
	started := []any{"listen", proxyLn.Addr().String()}
	if apiLn != nil {
		started = append(started, "apiListen", apiLn.Addr().String())
	}
	if metricsLn != nil {
		started = append(started, "metricsListen", metricsLn.Addr().String())
	}
	started = append(started, "rotation", string(cfg.mode), "auth", len(cfg.tokens) > 0)
	if remote != nil {
		log.Info("gateway started", append(started, "poolAPI", cfg.poolAPI, "outageGrace", cfg.outageGrace.String())...)
	} else {
		log.Info("gateway started", append(started, "members", len(members), "probes", cfg.probe != nil, "mitm", cfg.mitm != nil)...)
	}

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
	if err := gw.Shutdown(drainCtx); err != nil {
		log.Warn("shutdown grace ran out; open connections were closed", "grace", cfg.shutdownGrace.String(), "err", err)
	}
	for _, srv := range httpServers {
		if err := srv.Shutdown(drainCtx); err != nil {
			_ = srv.Close()
		}
	}
	log.Info("stopped")
	return runErr
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
