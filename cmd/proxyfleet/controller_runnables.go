//go:build !sidecar

package main

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/gc"
	"github.com/proxyfleet/proxyfleet/controller/providerhealth"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/providers"
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
		durationFlag(flagGCInterval, gc.DefaultInterval, "time between orphan GC sweeps (the first runs one interval after start)"),
		durationFlag(flagGCMinAge, gc.DefaultMinAge, "the orphan GC never deletes an instance younger than this (it may be mid-create)"),
		boolFlag(flagGCAllowNamespaced, "run the orphan GC even with --proxy-namespace: instances of Proxies in other namespaces are then deleted as orphans"),
		durationFlag(flagProviderCheckInterval, providerhealth.DefaultInterval, "time between provider health checks; 0 turns them off, otherwise at least 10s"),
		durationFlag(flagProviderCheckTimeout, 0, "bound on one round of provider checks (default 15s, or the interval when shorter)"),
	}
}

// runnableSettings are the parsed runnable flags.
type runnableSettings struct {
	gcInterval, gcMinAge        time.Duration
	gcAllowNamespaced           bool
	checkInterval, checkTimeout time.Duration
}

// parseRunnableFlags validates the runnable flags, naming the one that is wrong.
func parseRunnableFlags(c *cli.Context) (runnableSettings, error) {
	s := runnableSettings{
		gcInterval:        c.Duration(flagGCInterval),
		gcMinAge:          c.Duration(flagGCMinAge),
		gcAllowNamespaced: c.Bool(flagGCAllowNamespaced),
		checkInterval:     c.Duration(flagProviderCheckInterval),
		checkTimeout:      c.Duration(flagProviderCheckTimeout),
	}
	if err := s.validate(); err != nil {
		return s, err
	}
	// The GC would refuse to start after connecting; say so before, as a
	// flag error. Without providers there is no GC and nothing to refuse.
	if ns := c.String(flagProxyNamespace); ns != "" && c.Path(flagProvidersConfig) != "" && !s.gcAllowNamespaced {
		return s, fmt.Errorf("--%s %s hides Proxies in other namespaces from the orphan GC, which would then delete their instances: "+
			"add --%s only if no Proxy outside %s uses these providers", flagProxyNamespace, ns, flagGCAllowNamespaced, ns)
	}
	return s, nil
}

func (s runnableSettings) validate() error {
	if s.gcInterval <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagGCInterval, s.gcInterval)
	}
	if s.gcMinAge <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", flagGCMinAge, s.gcMinAge)
	}
	if s.checkInterval < 0 || (s.checkInterval > 0 && s.checkInterval < providerhealth.MinInterval) {
		return fmt.Errorf("--%s must be 0 (off) or at least %s, got %s", flagProviderCheckInterval, providerhealth.MinInterval, s.checkInterval)
	}
	if s.checkTimeout < 0 {
		return fmt.Errorf("--%s must not be negative, got %s", flagProviderCheckTimeout, s.checkTimeout)
	}
	if s.checkInterval > 0 && s.checkTimeout > s.checkInterval {
		return fmt.Errorf("--%s (%s) must not exceed --%s (%s)", flagProviderCheckTimeout, s.checkTimeout, flagProviderCheckInterval, s.checkInterval)
	}
	return nil
}

// addRunnables adds the orphan GC and the provider health monitor to mgr and
// registers the provider health gauges with reg. provs are the providers the
// reconciler uses (decorated ones are fine: the monitor looks through the
// decorators); pcfg is the providers config they came from, nil without one.
// proxyNamespace is the manager cache's namespace restriction.
func addRunnables(mgr ctrl.Manager, s runnableSettings, proxyNamespace string, pcfg *providers.Config,
	provs map[string]providers.Provider, reg prometheus.Registerer, logger logr.Logger) (*providerhealth.Monitor, error) {
	if len(provs) > 0 {
		sw, err := gc.New(gc.Options{
			Reader:          mgr.GetClient(),
			Providers:       provs,
			Interval:        s.gcInterval,
			MinAge:          s.gcMinAge,
			Namespace:       proxyNamespace,
			AllowNamespaced: s.gcAllowNamespaced,
			Logger:          logger.WithName("gc"),
			Recorder:        metrics.NewOrphanDeletions(reg),
		})
		if err != nil {
			return nil, err
		}
		if err := mgr.Add(sw); err != nil {
			return nil, fmt.Errorf("adding the orphan GC: %w", err)
		}
	} else {
		logger.Info("orphan GC off: no providers are configured, so there is nothing to sweep")
	}
	types := map[string]string{}
	if pcfg != nil {
		for _, e := range pcfg.Providers {
			types[e.Name] = e.Type
		}
	}
	// Added even without providers or checks: at start it deletes the
	// ProviderHealth objects no provider of this process reports on.
	mon, err := providerhealth.New(providerhealth.Options{
		Checkers:  providerhealth.TracedCheckers(providerhealth.CheckersFrom(provs)),
		Types:     types,
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Interval:  s.checkInterval,
		Timeout:   s.checkTimeout,
		Logger:    logger.WithName("providerhealth"),
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(mon); err != nil {
		return nil, fmt.Errorf("adding the provider health monitor: %w", err)
	}
	if err := reg.Register(metrics.NewProviderHealthCollector(mon)); err != nil {
		return nil, fmt.Errorf("registering the provider health gauges: %w", err)
	}
	return mon, nil
}
