package manager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/metrics"
)

// registerProxyCollector registers proxyfleet_proxies{phase} with reg, read
// from mgr's cache at every scrape.
func registerProxyCollector(mgr ctrl.Manager, reg prometheus.Registerer) error {
	c := metrics.NewProxyCollector(controller.PhaseCounter{Reader: mgr.GetCache()}, 0)
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("registering the Proxy phase gauge: %w", err)
	}
	return nil
}
