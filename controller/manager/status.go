package manager

import (
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/leases"
)

// setupStatus adds the status page to mgr, reading the lease store of api
// (nil when the lease API is off).
func (r *run) setupStatus(mgr ctrl.Manager, api *leases.API) error {
	listen, name := r.cfg.StatusListen, or(r.cfg.Names.StatusListen, "StatusListen")
	if listen == "" {
		r.log.Info("status page off (" + name + " 0)")
		return nil
	}
	f := controller.FleetStatus{Cache: mgr.GetCache(), APIReader: mgr.GetAPIReader(), Namespace: r.cfg.Manager.ProxyNamespace, Logger: r.log}
	if api != nil {
		f.Store, f.LeaseRequests = api.Store(), r.requests
	}
	if _, err := controller.SetupStatus(mgr, listen, f); err != nil {
		return fmt.Errorf("%s %s: %w", name, listen, err)
	}
	return nil
}
