package manager

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/providers"
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

// registerPriceCollector registers proxyfleet_proxy_hourly_price with reg,
// read from mgr's cache and the providers' configured prices at every
// scrape.
func registerPriceCollector(mgr ctrl.Manager, reg prometheus.Registerer, provs map[string]providers.Provider) error {
	c := metrics.NewProxyPriceCollector(priceSource{controller.PriceLister{Reader: mgr.GetCache(), Providers: provs}}, 0)
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("registering the Proxy price gauge: %w", err)
	}
	return nil
}

// priceSource is the controller's PriceLister as the metrics package reads
// it.
type priceSource struct{ l controller.PriceLister }

func (s priceSource) ProxyHourlyPrices(ctx context.Context) ([]metrics.ProxyPrice, error) {
	list, err := s.l.ProxyHourlyPrices(ctx)
	out := make([]metrics.ProxyPrice, 0, len(list))
	for _, p := range list {
		out = append(out, metrics.ProxyPrice{Namespace: p.Namespace, Name: p.Name, Provider: p.Provider, Price: p.Price})
	}
	return out, err
}
