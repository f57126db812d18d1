//go:build !sidecar

package main

import (
	"fmt"
	"net/netip"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/manager"
	"github.com/proxyfleet/proxyfleet/providers"
	awsprovider "github.com/proxyfleet/proxyfleet/providers/aws"
	doprovider "github.com/proxyfleet/proxyfleet/providers/digitalocean"
	gcpprovider "github.com/proxyfleet/proxyfleet/providers/gcp"
	hetznerprovider "github.com/proxyfleet/proxyfleet/providers/hetzner"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
)

// providerDecoders are the provider types this binary carries, each with the
// reader of its block in the providers config file; providerConstructors
// has the same types' constructors.
func providerDecoders() map[string]providers.Decoder {
	return map[string]providers.Decoder{
		kubeprovider.Type:    providers.DecoderOf(kubeprovider.ReadConfig),
		gcpprovider.Type:     providers.DecoderOf(gcpprovider.ReadConfig),
		kvmprovider.Type:     providers.DecoderOf(kvmprovider.ReadConfig),
		awsprovider.Type:     providers.DecoderOf(awsprovider.ReadConfig),
		doprovider.Type:      providers.DecoderOf(doprovider.ReadConfig),
		hetznerprovider.Type: providers.DecoderOf(hetznerprovider.ReadConfig),
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

// readProviders reads and validates --providers-config and gives the run
// the constructors of the provider types this binary carries.
func (cfg *controllerConfig) readProviders(c *cli.Context) (err error) {
	cfg.Providers.File = c.Path(flagProvidersConfig)
	cfg.Providers.Config, err = loadProvidersConfig(cfg.Providers.File)
	if err != nil {
		return err
	}
	targets, err := clusterTargetsFrom(c)
	if err != nil {
		return err
	}
	cfg.Providers.Constructors = func(env manager.Env) map[string]providers.Constructor {
		return providerConstructors(env, targets)
	}
	if id := c.String(flagInstallationID); id != "" {
		if err := controller.CheckInstallationID(id); err != nil {
			return fmt.Errorf("--%s: %w", flagInstallationID, err)
		}
		cfg.Providers.Installation = id
	}
	return nil
}

// providerConstructors are the constructors of the types providerDecoders
// reads, given what they need of the run; the kubernetes provider's Squids
// admit clusterTargets (--cluster-target-cidrs).
func providerConstructors(env manager.Env, clusterTargets []netip.Prefix) map[string]providers.Constructor {
	return map[string]providers.Constructor{
		kubeprovider.Type:    kubeprovider.Constructor(env.Client, clusterTargets),
		gcpprovider.Type:     gcpprovider.Constructor(env.Context),
		kvmprovider.Type:     kvmprovider.Constructor(env.Logger.WithName("kvm")),
		awsprovider.Type:     awsprovider.Constructor(env.Context),
		doprovider.Type:      doprovider.Constructor(),
		hetznerprovider.Type: hetznerprovider.Constructor(),
	}
}
