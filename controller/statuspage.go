package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// statusReadTimeout bounds the reads behind one status page request.
const statusReadTimeout = 5 * time.Second

// FleetStatus reads what the controller's status page shows: Proxies and
// ProxyPools from the manager's cache (the namespace it watches),
// ProviderHealth objects through the API reader (they are cluster-scoped,
// and a cached read would start a cluster-wide informer), and members,
// leases and cooldowns from the lease store.
type FleetStatus struct {
	// Cache reads Proxies and ProxyPools.
	Cache client.Reader
	// APIReader reads ProviderHealths.
	APIReader client.Reader
	// Store is the lease API's store; nil when the lease API is off.
	Store pool.LeaseStore
	// LeaseRequests is the timeline the lease API's recorder feeds; nil
	// when the lease API is off.
	LeaseRequests *statuspage.Timeline
	// Namespace is --proxy-namespace, for the page's header.
	Namespace string
	Logger    logr.Logger
	// Clock is the time source (the real clock when nil).
	Clock clock.PassiveClock
}

// View builds the page's data. Failed reads are logged and shown as fixed
// phrases; what could be read is shown.
func (f FleetStatus) View(ctx context.Context) statuspage.FleetView {
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	var now clock.PassiveClock = clock.RealClock{}
	if f.Clock != nil {
		now = f.Clock
	}
	in := statuspage.FleetInput{Namespace: f.Namespace, LeaseStore: f.Store != nil}
	fail := func(what string, err error) {
		f.Logger.Error(err, "status page: "+what+" failed")
		in.Errors = append(in.Errors, what+" failed (see the controller's log)")
	}
	var proxies v1alpha1.ProxyList
	if err := f.Cache.List(ctx, &proxies); err != nil {
		fail("listing Proxies", err)
	}
	var pools v1alpha1.ProxyPoolList
	if err := f.Cache.List(ctx, &pools); err != nil {
		fail("listing ProxyPools", err)
	}
	var phs v1alpha1.ProviderHealthList
	if err := f.APIReader.List(ctx, &phs); err != nil {
		fail("listing ProviderHealths", err)
	}
	in.Proxies, in.Pools, in.Providers = FleetRows(proxies.Items, pools.Items, phs.Items)
	if f.Store != nil {
		ms, err := f.Store.ListMembers(ctx)
		var cs []pool.Cooldown
		if err == nil {
			cs, err = f.Store.ListCooldowns(ctx)
		}
		if err != nil {
			f.Logger.Error(err, "status page: reading the lease store failed")
			in.Pool.Err = "the lease store could not be read (see the controller's log)"
		}
		in.Pool.Members, in.Pool.Cooldowns = ms, cs
	}
	if f.LeaseRequests != nil {
		in.LeaseRequests = f.LeaseRequests.Chart()
	}
	return statuspage.Fleet(in, now.Now())
}

// FleetRows converts the objects into the page's rows. It reads no
// Secret and no credentials: addresses are host:port.
func FleetRows(proxies []v1alpha1.Proxy, pools []v1alpha1.ProxyPool, phs []v1alpha1.ProviderHealth) ([]statuspage.Proxy, []statuspage.Pool, []statuspage.Provider) {
	px := make([]statuspage.Proxy, 0, len(proxies))
	for i := range proxies {
		p := &proxies[i]
		row := statuspage.Proxy{
			Namespace: p.Namespace, Name: p.Name, Phase: string(p.Status.Phase), Mode: string(p.Spec.Mode),
			Provider: p.Spec.Provider, Address: p.Address(), LatencyMillis: p.Status.LatencyMillis,
			Pool: p.Labels[v1alpha1.LabelPool], CreatedAt: p.CreationTimestamp.UTC(),
		}
		if p.Status.Phase != v1alpha1.PhaseReady {
			row.Message = firstNotTrue(p.Status.Conditions)
		}
		px = append(px, row)
	}
	pl := make([]statuspage.Pool, 0, len(pools))
	for _, p := range pools {
		pl = append(pl, statuspage.Pool{
			Namespace: p.Namespace, Name: p.Name, Desired: p.Status.DesiredReplicas, Current: p.Status.Replicas,
			Ready: p.Status.ReadyReplicas, Draining: p.Status.DrainingReplicas,
		})
	}
	pr := make([]statuspage.Provider, 0, len(phs))
	for _, h := range phs {
		row := statuspage.Provider{Name: h.Name, Type: h.Status.Type, Ready: h.Status.Ready, TargetsReady: h.Status.TargetsReady, Targets: []statuspage.ProviderTarget{}}
		if h.Status.LastCheckTime != nil {
			t := h.Status.LastCheckTime.UTC()
			row.LastCheck = &t
		}
		for _, t := range h.Status.Targets {
			row.Targets = append(row.Targets, statuspage.ProviderTarget{Name: t.Name, Ready: t.Ready, Reason: t.Reason, Message: t.Message})
		}
		pr = append(pr, row)
	}
	return px, pl, pr
}

// firstNotTrue is "Type: Reason: message" of the first condition that is
// not True, or "".
func firstNotTrue(cs []metav1.Condition) string {
	for _, c := range cs {
		if c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("%s: %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	return ""
}

// StatusServer serves the fleet's status page on its own listener on
// every replica (not leader-elected: any replica's cache and the shared
// store show the fleet). A manager Runnable.
type StatusServer struct {
	ln  net.Listener
	srv *http.Server
	log logr.Logger
}

// SetupStatus opens listen (so a busy port fails at start) and adds the
// page's server to mgr.
func SetupStatus(mgr manager.Manager, listen string, f FleetStatus) (*StatusServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("status page: cannot listen on %s: %w", listen, err)
	}
	log := f.Logger.WithName("status")
	s := &StatusServer{ln: ln, log: log, srv: httpserver.New(statuspage.Handler(statuspage.HandlerOptions{
		Title: "proxyfleet controller",
		View:  func(ctx context.Context) any { return f.View(ctx) },
	}), slog.New(logr.ToSlogHandler(log)), httpserver.Timeouts{})}
	if err := mgr.Add(s); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("status page: adding the server: %w", err)
	}
	return s, nil
}

// Addr is the address the page listens on.
func (s *StatusServer) Addr() net.Addr { return s.ln.Addr() }

// NeedLeaderElection is false: every replica serves its page.
func (s *StatusServer) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, then shuts the server down.
func (s *StatusServer) Start(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	s.log.Info("status page serving", "addr", "http://"+s.ln.Addr().String()+statuspage.PagePath)
	select {
	case err := <-errc:
		return fmt.Errorf("status page: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = s.srv.Close()
	}
	return nil
}
