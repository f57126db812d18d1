package manager

import (
	"fmt"
	"log/slog"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/metrics"
)

// setupLeaseAPI adds the lease API (its Proxy source and server) to mgr and
// registers proxyfleet_lease_requests_total (which also feeds the status
// page's chart) and the scrape-time pool gauges (leases_active,
// cooldowns_active, members, site_cooldowns). It returns nil when the API
// is off. The listener is open when it returns.
func (r *run) setupLeaseAPI(mgr ctrl.Manager) (*leases.API, error) {
	s, name := r.cfg.LeaseAPI, or(r.cfg.Names.LeaseAPIListen, "LeaseAPI.Listen")
	if s.Listen == "" {
		r.log.Info("lease API off (" + name + " 0)")
		return nil, nil
	}
	backend, _, err := s.LeaseStore.Open(s.Store, slog.New(logr.ToSlogHandler(r.log.WithName("leasestore"))), r.reg)
	if err != nil {
		return nil, err
	}
	o := leases.Options{
		Listen:   s.Listen,
		Token:    s.Token,
		Store:    s.Store,
		Backend:  backend,
		Recorder: metrics.NewLeaseRequests(r.reg, r.requests),
		Logger:   r.log,
		Tenancy:  s.Tenancy,
	}
	if r.tr != nil {
		o.Tracing = r.tr.TracerProvider()
	}
	if s.TokenReview {
		o.Reviewer = &leases.Reviewer{Client: mgr.GetClient(), Audience: s.Audience}
	}
	api, err := leases.Setup(mgr, o)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, s.Listen, err)
	}
	if err := r.reg.Register(metrics.NewPoolCollector(api.Store())); err != nil {
		return nil, fmt.Errorf("registering the lease pool gauges: %w", err)
	}
	if err := r.reg.Register(metrics.NewSiteCooldownCollector(api.Store(), 0)); err != nil {
		return nil, fmt.Errorf("registering the site cooldown gauge: %w", err)
	}
	return api, nil
}
