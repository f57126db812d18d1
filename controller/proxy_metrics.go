package controller

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

// PhaseCounter counts Proxies by status.phase for the scrape-time metrics
// collector (it satisfies metrics.ProxyPhases). Reader is the manager's
// cache, so a scrape costs no API call.
type PhaseCounter struct {
	Reader client.Reader
}

// ProxiesByPhase lists the Proxies and counts them by phase, every known
// phase included. A Proxy the reconciler has not written yet (no phase)
// counts as Pending, which is what its first status write will say.
func (c PhaseCounter) ProxiesByPhase(ctx context.Context) (map[string]int, error) {
	var list v1alpha1.ProxyList
	if err := c.Reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing Proxies: %w", err)
	}
	// Every phase is counted, so one nobody is in shows as 0 rather than as
	// a missing series.
	counts := map[string]int{}
	for _, ph := range [...]v1alpha1.ProxyPhase{
		v1alpha1.PhasePending, v1alpha1.PhaseProvisioning, v1alpha1.PhaseReady,
		v1alpha1.PhaseUnhealthy, v1alpha1.PhaseFailed, v1alpha1.PhaseDeleting,
	} {
		counts[string(ph)] = 0
	}
	for i := range list.Items {
		ph := list.Items[i].Status.Phase
		if ph == "" {
			ph = v1alpha1.PhasePending
		}
		counts[string(ph)]++
	}
	return counts, nil
}

// ProxyPrice is the hourly price of one Managed Proxy's instance.
type ProxyPrice struct {
	Namespace, Name, Provider string
	Price                     float64
}

// PriceLister lists the hourly price of every Managed Proxy that has an
// instance (status.providerID set) on a provider entry that gives a price
// (providers.Pricer), for the scrape-time price collector. Reader is the
// manager's cache.
type PriceLister struct {
	Reader    client.Reader
	Providers map[string]providers.Provider
}

// ProxyHourlyPrices lists the Proxies and prices those with an instance.
func (l PriceLister) ProxyHourlyPrices(ctx context.Context) ([]ProxyPrice, error) {
	prices := map[string]float64{}
	for name, p := range l.Providers {
		if price := providers.HourlyPriceOf(p); price > 0 {
			prices[name] = price
		}
	}
	if len(prices) == 0 {
		return nil, nil
	}
	var list v1alpha1.ProxyList
	if err := l.Reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing Proxies: %w", err)
	}
	var out []ProxyPrice
	for i := range list.Items {
		px := &list.Items[i]
		price, ok := prices[px.Spec.Provider]
		if !ok || px.Spec.Mode != v1alpha1.ModeManaged || px.Status.ProviderID == "" {
			continue
		}
		out = append(out, ProxyPrice{Namespace: px.Namespace, Name: px.Name, Provider: px.Spec.Provider, Price: price})
	}
	return out, nil
}
