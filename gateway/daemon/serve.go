package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/internal/textpages"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// serve listens, serves until ctx ends or a server fails, then drains for
// up to the shutdown grace. Background work (probes, reloads) stops only
// after the gateway has drained, so the pool stays right for in-flight
// requests.
func (r *run) serve(ctx context.Context, stopSignals func()) error {
	cfg, log, n := r.cfg, r.log, r.cfg.Names
	proxyName, apiName, metricsName := or(n.Listen, "Listen"), or(n.APIListen, "APIListen"), or(n.MetricsListen, "MetricsListen")
	lns, err := listenAll([]listenAddr{{proxyName, cfg.Listen}, {apiName, cfg.APIListen}, {metricsName, cfg.MetricsListen},
		{or(n.StatusListen, "StatusListen"), cfg.StatusListen}})
	if err != nil {
		return err
	}
	proxyLn, apiLn, metricsLn, statusLn := lns[0], lns[1], lns[2], lns[3]
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
	serveErr := make(chan error, 4)
	go func() { serveErr <- serveErrOf(proxyName, r.gw.Serve(proxyLn)) }()
	var ready metrics.Readiness
	httpServers := r.serveHTTP(apiLn, metricsLn, statusLn, &ready, serveErr)
	ready.Serving()
	r.started(proxyLn, apiLn, metricsLn, statusLn)
	r.releaseStartPages()
	settled := time.AfterFunc(StartSettle, r.releaseStartPages)
	defer settled.Stop()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace", cfg.ShutdownGrace.String())
	case runErr = <-serveErr:
		log.Error("server failed; shutting down", "err", runErr)
	}
	stopSignals() // a second signal kills the process at once
	ready.Stopping()
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := r.gw.Shutdown(drainCtx); err != nil {
		log.Warn("shutdown grace ran out; open connections were closed", "grace", cfg.ShutdownGrace.String(), "err", err)
	}
	for _, hs := range httpServers {
		if err := hs.Shutdown(drainCtx); err != nil {
			_ = hs.Close()
		}
	}
	log.Info("stopped")
	return runErr
}

// StartSettle is how long after its listeners are up a gateway gives
// back its binary's start pages a second time: the first lap of every
// background job (the first lease-API answer, probe round, reload and
// collection) runs code no request needs again, which the first release,
// made as the listeners come up, cannot catch. Measured on the sidecar
// (docs/performance.md): its mapped binary 7.3 MiB after the first
// release, 3.9 MiB after the second.
const StartSettle = 10 * time.Second

// releaseStartPages unmaps the binary's pages the process no longer uses
// (textpages says why that matters beside a crawler pod); what is used
// again comes back from the page cache.
func (r *run) releaseStartPages() {
	if n, err := textpages.Release(); err != nil {
		r.log.Debug("start pages not released", "err", err)
	} else {
		r.log.Debug("start pages released", "mappedKiB", n>>10)
	}
}

// serveHTTP serves the lease API (when listened for), the status page on
// its own address (when listened for) and the metrics, and returns their
// servers in the order they drain: the metrics server last, so /readyz
// answers 503 while everything else drains.
func (r *run) serveHTTP(apiLn, metricsLn, statusLn net.Listener, ready *metrics.Readiness, serveErr chan<- error) []*http.Server {
	n := r.cfg.Names
	var servers []*http.Server
	if apiLn != nil {
		if r.cfg.APIToken == "" {
			r.log.Warn("lease API has no token ("+or(n.APIToken, "APIToken")+"): any process that can reach it can lease and report", "addr", apiLn.Addr().String())
		}
		api := httpserver.New(tracing.Handler(leaseapi.NewAPIServer(r.store, leaseapi.APIOptions{Token: r.cfg.APIToken, Logger: r.log, Recorder: r.rec}), r.tr.TracerProvider(), "leaseapi"),
			r.log, r.cfg.HTTPTimeouts)
		servers = append(servers, api)
		go func() { serveErr <- serveErrOf(or(n.APIListen, "APIListen"), api.Serve(apiLn)) }()
	}
	if statusLn != nil {
		ss := httpserver.New(r.statusHandler(http.NotFoundHandler()), r.log, r.cfg.HTTPTimeouts)
		servers = append(servers, ss)
		go func() { serveErr <- serveErrOf(or(n.StatusListen, "StatusListen"), ss.Serve(statusLn)) }()
	}
	if metricsLn != nil {
		ms := httpserver.New(r.metricsHandler(metricsLn, statusLn != nil, ready), r.log, r.cfg.HTTPTimeouts)
		servers = append(servers, ms)
		go func() { serveErr <- serveErrOf(or(n.MetricsListen, "MetricsListen"), ms.Serve(metricsLn)) }()
	}
	return servers
}

// metricsHandler serves /metrics, /healthz and /readyz, and on a
// loopback address the status page, unless the page has an address of its
// own (elsewhere). The page has no authentication and shows what the
// lease API gives only to token holders (the fleet's members with their
// hosts and attributes, its cooldowns by site, the API's URL), so an
// address others reach (the sidecar's :15090 on the pod network, which the
// kubelet's probes and Prometheus need) serves the probes and metrics
// only; the metrics carry no member address and at most 20 sites by name,
// which a scraper may see.
func (r *run) metricsHandler(metricsLn net.Listener, elsewhere bool, ready *metrics.Readiness) http.Handler {
	next := metrics.Handler(r.reg, ready.Ready)
	if elsewhere || !StatusServedOn(metricsLn.Addr()) {
		return withholdStatus(next, r.cfg.Names, elsewhere)
	}
	return r.statusHandler(next)
}

// statusHandler serves the status page, read from srv, and passes every
// other path to next.
func (r *run) statusHandler(next http.Handler) http.Handler {
	return statuspage.GatewayHandler(statuspage.GatewayOptions{Pool: r.srv, PoolAPI: r.cfg.PoolAPI, Requests: r.requests,
		Paces: r.gw.PaceStatus, Next: next})
}

// StatusServedOn reports whether the gateway serves its status page on
// the metrics address a: only on loopback (an unspecified address such as
// ":15090" listens on every interface and is not).
func StatusServedOn(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// withholdStatus answers the status page's paths with a 404 that says why
// and how to see the page (on its own address when elsewhere), and passes
// every other path to next.
func withholdStatus(next http.Handler, n Names, elsewhere bool) http.Handler {
	status := or(n.StatusListen, "StatusListen")
	msg := "status: the status page is served only on a loopback address (it lists the fleet's members and cooldowns and has no authentication);" +
		" run the gateway with " + status + " 127.0.0.1:PORT and open it there, through kubectl port-forward in a cluster\n"
	if elsewhere {
		msg = "status: the status page is served on the " + status + " address, not here\n"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == statuspage.PagePath || req.URL.Path == statuspage.JSONPath {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, msg)
			return
		}
		next.ServeHTTP(w, req)
	})
}

// started prints the usage block (text logs) and logs the start record,
// which carries every address the block prints: with JSON logs it is the
// only place they are written.
func (r *run) started(proxyLn, apiLn, metricsLn, statusLn net.Listener) {
	cfg := r.cfg
	if !cfg.LogJSON { // JSON logs are read by machines: every line on stderr is a record
		printUsage(r.stderr, cfg, r.members, proxyLn, apiLn, metricsLn, statusLn)
	}
	started := []any{"listen", proxyLn.Addr().String()}
	if apiLn != nil {
		started = append(started, "apiListen", apiLn.Addr().String())
	}
	if metricsLn != nil {
		started = append(started, "metricsListen", metricsLn.Addr().String())
	}
	if statusLn != nil {
		started = append(started, "statusListen", statusLn.Addr().String())
	}
	started = append(started, "rotation", string(cfg.Mode), "auth", len(cfg.Clients) > 0)
	if r.remote != nil {
		r.log.Info("gateway started", append(started, "poolAPI", cfg.PoolAPI, "outageGrace", cfg.OutageGrace.String())...)
		return
	}
	r.log.Info("gateway started", append(started, "members", len(r.members), "probes", cfg.Probe != nil, "mitm", cfg.MITM != nil)...)
}

// listenAddr is an address to listen on ("" none) and its setting's name.
type listenAddr struct{ name, addr string }

// listenAll opens a listener per address, nil for an empty one, or closes
// what it opened and returns an error naming the setting and address.
func listenAll(addrs []listenAddr) ([]net.Listener, error) {
	lns := make([]net.Listener, len(addrs))
	for i, a := range addrs {
		if a.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			closeAll(lns)
			return nil, fmt.Errorf("%s %s: cannot listen: %w", a.name, a.addr, err)
		}
		lns[i] = ln
	}
	return lns, nil
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// serveErrOf turns a Serve return into nil for a normal shutdown, or an error
// naming the listener that failed.
func serveErrOf(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}
