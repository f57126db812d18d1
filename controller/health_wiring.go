package controller

import (
	"errors"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/health"
)

// SetupHealthEngine creates the health engine over the manager's cache, adds
// it to mgr (it runs on the leader only) and connects it to r: the engine's
// events re-enqueue Proxies through a channel source, and r stages the
// engine's verdicts into status. Call it before r.SetupWithManager. A nil
// o.Reader means mgr.GetCache(), a nil o.Credentials the manager's
// credentials cache (NewManager), so probes log in with the Proxies' logins.
func SetupHealthEngine(mgr ctrl.Manager, r *ProxyReconciler, o health.Options) (*health.Engine, error) {
	if o.Reader == nil {
		o.Reader = mgr.GetCache()
	}
	if o.Credentials == nil {
		if c := CredentialsCacheOf(mgr); c != nil {
			o.Credentials = c
		} else {
			return nil, errors.New("the health engine needs the credentials Secret cache: build the manager with controller.NewManager or set Options.Credentials")
		}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = mgr.GetLogger().WithName("health")
	}
	e, err := health.New(o)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(e); err != nil {
		return nil, fmt.Errorf("adding the health engine to the manager: %w", err)
	}
	r.HealthEvents = e.Events()
	r.Health = e
	return e, nil
}
