package manager

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/providers"
)

// buildProviders builds every entry of the providers config with the
// constructors the command gave, each wrapped so its requests are counted
// when rec is set (provider_requests_total{provider,op,result}) and
// traced. Without a config it returns nil: the reconciler then fails
// Managed Proxies with a condition saying no providers config was given.
func (r *run) buildProviders(ctx context.Context, kube *rest.Config, mgr ctrl.Manager, rec providers.RequestRecorder) (map[string]providers.Provider, error) {
	p := r.cfg.Providers
	if p.Config == nil {
		return nil, nil
	}
	if p.Constructors == nil {
		return nil, errors.New("no provider constructors were given")
	}
	direct, err := client.New(kube, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("creating the kubernetes provider's client: %w", err)
	}
	reg := providers.NewRegistry(p.Constructors(Env{Context: context.WithoutCancel(ctx), Client: direct, Logger: mgr.GetLogger()}))
	built, err := reg.Build(*p.Config)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return built, nil
	}
	out := make(map[string]providers.Provider, len(built))
	for name, prov := range built {
		out[name] = providers.WithTracing(providers.WithMetrics(prov, name, rec), name)
	}
	return out, nil
}
