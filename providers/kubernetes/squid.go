package kubernetes

import (
	"net/netip"

	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// DefaultDeniedDestinations are the ranges no generated Squid ever connects
// to; see squidconf.DefaultDeniedDestinations. Config.ClusterCIDRs adds the
// cluster ranges that are not already among them.
func DefaultDeniedDestinations() []netip.Prefix { return squidconf.DefaultDeniedDestinations() }

// DefaultClientCIDRs are the source ranges allowed to use a Squid Pod when
// Config.ClientCIDRs is empty; see squidconf.DefaultClientCIDRs.
func DefaultClientCIDRs() []netip.Prefix { return squidconf.DefaultClientCIDRs() }
