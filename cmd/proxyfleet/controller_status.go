//go:build !sidecar

package main

import (
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/leaseapi"
	"github.com/proxyfleet/proxyfleet/status"
)

// flagStatusListen is where the controller serves its status page.
const flagStatusListen = "status-listen"

// defaultStatusListen is loopback: the page is for `kubectl port-forward`,
// not for the cluster network.
const defaultStatusListen = "127.0.0.1:8082"

// statusFlags are the status page's flags; controllerCommand appends them.
func statusFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagStatusListen, defaultStatusListen, "`ADDR` serving the fleet's live status page (/status, /status.json) on every replica; 0 turns it off"),
	}
}

// statusSettings are the parsed status flags; listen "" is off. The
// timeline always exists (the lease API's recorder feeds it either way).
type statusSettings struct {
	listen        string
	leaseRequests *status.Timeline
}

// parseStatusFlags validates --status-listen, naming it when wrong.
func parseStatusFlags(c *cli.Context) (statusSettings, error) {
	s := statusSettings{leaseRequests: status.NewTimeline(status.TimelineOptions{})}
	switch addr := strings.TrimSpace(c.String(flagStatusListen)); addr {
	case "", "0", "off":
	default:
		if _, err := checkListenAddr(flagStatusListen, addr); err != nil {
			return s, err
		}
		s.listen = addr
	}
	return s, nil
}

// setupStatus adds the status page to mgr, reading the lease store of api
// (nil when the lease API is off).
func setupStatus(mgr ctrl.Manager, s statusSettings, api *leaseapi.API, namespace string, logger logr.Logger) error {
	if s.listen == "" {
		logger.Info("status page off (--" + flagStatusListen + " 0)")
		return nil
	}
	f := controller.FleetStatus{Cache: mgr.GetCache(), APIReader: mgr.GetAPIReader(), Namespace: namespace, Logger: logger}
	if api != nil {
		f.Store, f.LeaseRequests = api.Store(), s.leaseRequests
	}
	if _, err := controller.SetupStatus(mgr, s.listen, f); err != nil {
		return fmt.Errorf("--%s %s: %w", flagStatusListen, s.listen, err)
	}
	return nil
}
