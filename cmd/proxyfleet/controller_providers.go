//go:build !sidecar

package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/providers"
	gcpprovider "github.com/proxyfleet/proxyfleet/providers/gcp"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
)

// providerDecoders are the provider types this binary carries, each with the
// reader of its block in the providers config file; buildProviders has the
// same types' constructors.
func providerDecoders() map[string]providers.Decoder {
	return map[string]providers.Decoder{
		kubeprovider.Type: providers.DecoderOf(kubeprovider.ReadConfig),
		gcpprovider.Type:  providers.DecoderOf(gcpprovider.ReadConfig),
		kvmprovider.Type:  providers.DecoderOf(kvmprovider.ReadConfig),
	}
}

// loadProvidersConfig reads and validates --providers-config, every block
// by its type's reader, before anything connects; nil without one.
func loadProvidersConfig(path string) (*providers.Config, error) {
	if path == "" {
		return nil, nil
	}
	cfg, err := providers.LoadConfig(path, providerDecoders())
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagProvidersConfig, err)
	}
	return &cfg, nil
}

// buildProviders builds every entry of the providers config with the
// constructors this binary carries, each wrapped so its requests are counted
// when rec is set (provider_requests_total{provider,op,result}). Without a
// config it returns nil: the reconciler then fails Managed Proxies with a
// condition saying no providers config was given.
func buildProviders(ctx context.Context, pcfg *providers.Config, cfg *rest.Config, mgr ctrl.Manager, rec providers.RequestRecorder) (map[string]providers.Provider, error) {
	if pcfg == nil {
		return nil, nil
	}
	// The kubernetes provider talks to the API server directly, not through
	// the manager's cache (which would start a cluster-wide Pod informer).
	direct, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("creating the kubernetes provider's client: %w", err)
	}
	reg := providers.NewRegistry(map[string]providers.Constructor{
		kubeprovider.Type: kubeprovider.Constructor(direct),
		gcpprovider.Type:  gcpprovider.Constructor(ctx),
		kvmprovider.Type:  kvmprovider.Constructor(mgr.GetLogger().WithName("kvm")),
	})
	built, err := reg.Build(*pcfg)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return built, nil
	}
	out := make(map[string]providers.Provider, len(built))
	for name, p := range built {
		out[name] = providers.WithTracing(providers.WithMetrics(p, name, rec), name)
	}
	return out, nil
}
