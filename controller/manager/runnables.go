package manager

import (
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/gc"
	"github.com/proxyfleet/proxyfleet/controller/providerhealth"
	"github.com/proxyfleet/proxyfleet/metrics"
)

// addRunnables adds the orphan GC and the provider health monitor to mgr
// and registers the provider health gauges. They look at the providers the
// reconciler uses (decorated ones are fine: the monitor looks through the
// decorators) and at the providers config they came from.
func (r *run) addRunnables(mgr ctrl.Manager) (*providerhealth.Monitor, error) {
	if len(r.provs) > 0 {
		sw, err := gc.New(gc.Options{
			Reader:          mgr.GetClient(),
			Providers:       r.provs,
			Interval:        r.cfg.GC.Interval,
			MinAge:          r.cfg.GC.MinAge,
			Namespace:       r.cfg.Manager.ProxyNamespace,
			AllowNamespaced: r.cfg.GC.AllowNamespaced,
			Installation:    r.cfg.Providers.Installation,
			Logger:          r.log.WithName("gc"),
			Recorder:        metrics.NewOrphanDeletions(r.reg),
		})
		if err != nil {
			return nil, err
		}
		if err := mgr.Add(sw); err != nil {
			return nil, fmt.Errorf("adding the orphan GC: %w", err)
		}
	} else {
		r.log.Info("orphan GC off: no providers are configured, so there is nothing to sweep")
	}
	types := map[string]string{}
	if pcfg := r.cfg.Providers.Config; pcfg != nil {
		for _, e := range pcfg.Providers {
			types[e.Name] = e.Type
		}
	}
	// Added even without providers or checks: at start it deletes the
	// ProviderHealth objects no provider of this process reports on.
	mon, err := providerhealth.New(providerhealth.Options{
		Checkers:  providerhealth.TracedCheckers(providerhealth.CheckersFrom(r.provs)),
		Types:     types,
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Interval:  r.cfg.ProviderChecks.Interval,
		Timeout:   r.cfg.ProviderChecks.Timeout,
		Logger:    r.log.WithName("providerhealth"),
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(mon); err != nil {
		return nil, fmt.Errorf("adding the provider health monitor: %w", err)
	}
	if err := r.reg.Register(metrics.NewProviderHealthCollector(mon)); err != nil {
		return nil, fmt.Errorf("registering the provider health gauges: %w", err)
	}
	return mon, nil
}
