//go:build !sidecar

package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/controller/gc"
	"github.com/proxyfleet/proxyfleet/controller/manager"
	"github.com/proxyfleet/proxyfleet/controller/providerhealth"
)

// Flags of the controller's leader-only runnables: the orphan GC and the
// provider health monitor.
const (
	flagGCInterval            = "gc-interval"
	flagGCMinAge              = "gc-min-age"
	flagGCAllowNamespaced     = "gc-allow-namespaced"
	flagProviderCheckInterval = "provider-check-interval"
	flagProviderCheckTimeout  = "provider-check-timeout"
)

// runnableFlags are the flags of the orphan GC and the provider health
// monitor; controllerCommand appends them to its own.
func runnableFlags() []cli.Flag {
	return []cli.Flag{
		durationFlag(flagGCInterval, gc.DefaultInterval.String(), "time between orphan GC sweeps (the first runs one interval after start)"),
		durationFlag(flagGCMinAge, gc.DefaultMinAge.String(), "the orphan GC never deletes an instance younger than this (it may be mid-create)"),
		boolFlag(flagGCAllowNamespaced, "run the orphan GC even with --proxy-namespace: instances of Proxies in other namespaces are then deleted as orphans"),
		durationFlag(flagProviderCheckInterval, providerhealth.DefaultInterval.String(), "time between provider health checks; 0 turns them off, otherwise at least 10s"),
		durationFlag(flagProviderCheckTimeout, "0s", "bound on one round of provider checks (default 15s, or the interval when shorter)"),
	}
}

// readRunnables reads the orphan GC and provider health flags, naming the
// one that is wrong.
func (cfg *controllerConfig) readRunnables(c *cli.Context) error {
	cfg.GC = manager.GC{
		Interval:        c.Duration(flagGCInterval),
		MinAge:          c.Duration(flagGCMinAge),
		AllowNamespaced: c.Bool(flagGCAllowNamespaced),
	}
	cfg.ProviderChecks = manager.ProviderChecks{
		Interval: c.Duration(flagProviderCheckInterval),
		Timeout:  c.Duration(flagProviderCheckTimeout),
	}
	if err := checkRunnables(cfg.GC, cfg.ProviderChecks); err != nil {
		return err
	}
	// The GC would refuse to start after connecting; say so before, as a
	// flag error. Without providers there is no GC and nothing to refuse.
	if ns := c.String(flagProxyNamespace); ns != "" && c.Path(flagProvidersConfig) != "" && !cfg.GC.AllowNamespaced {
		return fmt.Errorf("--%s %s hides Proxies in other namespaces from the orphan GC, which would then delete their instances: "+
			"add --%s only if no Proxy outside %s uses these providers", flagProxyNamespace, ns, flagGCAllowNamespaced, ns)
	}
	return nil
}

// checkRunnables names the first runnable flag whose value is wrong.
func checkRunnables(g manager.GC, p manager.ProviderChecks) error {
	if g.Interval <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagGCInterval, g.Interval)
	}
	if g.MinAge <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagGCMinAge, g.MinAge)
	}
	if p.Interval < 0 || (p.Interval > 0 && p.Interval < providerhealth.MinInterval) {
		return fmt.Errorf("--%s must be 0 (off) or at least %s, got %s", flagProviderCheckInterval, providerhealth.MinInterval, p.Interval)
	}
	if p.Timeout < 0 {
		return fmt.Errorf("--%s must not be negative, got %s", flagProviderCheckTimeout, p.Timeout)
	}
	if p.Interval > 0 && p.Timeout > p.Interval {
		return fmt.Errorf("--%s (%s) must not exceed --%s (%s)", flagProviderCheckTimeout, p.Timeout, flagProviderCheckInterval, p.Interval)
	}
	return nil
}
