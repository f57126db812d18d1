// Package squidconf renders the squid.conf every proxyfleet-made Squid runs,
// whether in a Pod (the kubernetes provider) or on a VM (the gcp provider's
// bootstrap). One renderer keeps the never-an-open-proxy rules identical
// everywhere: a fix to them reaches every backend at once.
//
// It imports the standard library and internal/clustertargets (the
// admitted cluster ranges) only.
package squidconf

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
)

// DefaultDeniedDestinations are the ranges no generated Squid ever connects
// to: "this network", RFC 1918 private, CGNAT (100.64/10, also used by some
// clusters), loopback, link-local (169.254/16 holds the cloud metadata
// address), IETF protocol assignments, benchmarking, multicast and reserved
// space; and for IPv6 the unspecified and loopback addresses, unique-local
// (fc00::/7, where AWS's IPv6 metadata address lives), link-local and
// multicast. Typical Pod and Service CIDRs (10.96/12, 10.244/16, 192.168/16,
// fd00::/8) fall inside these; the kubernetes provider adds its clusterCIDRs for the ones that do not.
func DefaultDeniedDestinations() []netip.Prefix {
	return mustPrefixes(
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
	)
}

// DefaultClientCIDRs are the source ranges allowed to use a generated Squid
// when a provider has no client ranges configured: the private, CGNAT and unique-local ranges
// Pods normally have. A Squid reachable from anywhere else (a public Pod IP, a
// mistaken LoadBalancer) still refuses to be an open proxy.
func DefaultClientCIDRs() []netip.Prefix {
	return mustPrefixes("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
}

func mustPrefixes(list ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(list))
	for i, s := range list {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Config is everything the generated squid.conf depends on.
type Config struct {
	// Name becomes visible_hostname, distinct per instance so chained Squids
	// do not mistake each other for a forwarding loop.
	Name string
	// Port is the http_port.
	Port int
	// ListenAddr restricts http_port to one address; empty listens on all
	// (what a Pod needs). Tests bind 127.0.0.1.
	ListenAddr string
	// Denied are destination ranges refused for every request.
	Denied []netip.Prefix
	// Admitted are ranges cut out of Denied: the cluster's own pod and
	// service CIDRs (clustertargets), for sites in the cluster. Render
	// refuses a range outside the private ones, as clustertargets.Check
	// does. Loopback and the Squid's own addresses stay refused.
	Admitted []netip.Prefix
	// Clients are the source ranges allowed to use the proxy; empty allows
	// any source, which only a config with Auth may do (Render refuses
	// otherwise, so a Squid is never open by omission).
	Clients []netip.Prefix
	// Auth, when set, requires basic authentication from every client.
	Auth *Auth
}

// Auth is the basic authentication a Squid demands. Squid checks the
// credentials with its NCSA helper against an htpasswd file; the password
// itself never appears in squid.conf.
type Auth struct {
	// Helper is the path of basic_ncsa_auth on the machine Squid runs on.
	Helper string
	// PasswordFile is the htpasswd file the helper reads.
	PasswordFile string
	// Realm is shown in the 407 challenge.
	Realm string
}

// DefaultNCSAHelper is where Debian and Ubuntu install Squid's NCSA helper.
const DefaultNCSAHelper = "/usr/lib/squid/basic_ncsa_auth"

// Render returns squid.conf. The access rules, in order: first the gate,
// which decides on what the client sends and on nothing the request names:
// a source outside Clients is refused (403) and, with Auth, a request
// without a valid login is answered 407. Only then the rules about the
// request: the cache manager is never served; plain HTTP only to port 80,
// 443 or 1025 and up (no smuggling into SMTP and friends); CONNECT only to
// 443; nothing to loopback (to_localhost also covers the Pod's own
// addresses) or to the denied ranges, checked against the resolved address
// so a public name pointing inward is refused too; then the client is
// allowed; everything else denied.
//
// The gate comes first because a dst rule makes Squid resolve the name
// before it can answer: with the destination rules first, anyone who
// reaches the port could make the Squid look up names of their choosing,
// and hold a connection while it did, before being refused. The port,
// method and manager rules need no lookup, but after the gate a stranger
// learns nothing of the policy either: every request of theirs gets the
// same refusal.
//
// The Squid keeps no cache and no access log, adds no Via header and deletes
// X-Forwarded-For, so the target sees neither the chain nor the client.
//
// Admitted ranges are cut out of the denied destinations; nothing else
// changes.
//
// It panics when Clients is empty without Auth: that Squid would be an open
// proxy, a bug in the caller rather than a runtime condition; and when an
// admitted range is not private (the caller's parsing lets none through).
func (s Config) Render() string {
	if len(s.Clients) == 0 && s.Auth == nil {
		panic("squidconf: a Squid without client ranges must require authentication")
	}
	if err := clustertargets.Check(s.Admitted); err != nil {
		panic("squidconf: admitted ranges: " + err.Error())
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# Generated by proxyfleet for instance %s. Do not edit: replace the Proxy instead.", s.Name)
	if s.ListenAddr != "" {
		w("http_port %s", netip.AddrPortFrom(netip.MustParseAddr(s.ListenAddr), uint16(s.Port)))
	} else {
		w("http_port %d", s.Port)
	}
	w("visible_hostname %s", s.Name)
	w("")
	w("# Runs as a non-root user on a read-only root filesystem: no pid file, no")
	w("# disk cache, no helpers; cache.log level-1 messages reach stderr via -d 1.")
	w("pid_filename none")
	w("cache_log /dev/null")
	w("access_log none")
	w("logfile_rotate 0")
	w("netdb_filename none")
	w("pinger_enable off")
	w("coredump_dir /tmp")
	w("cache deny all")
	w("cache_mem 8 MB")
	w("shutdown_lifetime 5 seconds")
	w("")
	w("acl SSL_ports port 443")
	w("acl Safe_ports port 80 443 1025-65535")
	w("acl CONNECT method CONNECT")
	if len(s.Admitted) > 0 {
		// One deny list with the admitted ranges cut out of it, not an
		// allow rule before the deny: Squid's dst matches a name when any
		// of its addresses matches, so "deny denied !admitted" would pass a
		// name with one admitted and one other private address.
		w("# Admitted cluster ranges, cut out of the denied destinations: %s", JoinPrefixes(MergePrefixes(s.Admitted)))
	}
	w("acl proxyfleet_denied dst %s", JoinPrefixes(clustertargets.Subtract(MergePrefixes(s.Denied), s.Admitted)))
	if len(s.Clients) == 0 {
		w("acl proxyfleet_clients src all")
	} else {
		w("acl proxyfleet_clients src %s", JoinPrefixes(MergePrefixes(s.Clients)))
	}
	if a := s.Auth; a != nil {
		realm := a.Realm
		if realm == "" {
			realm = "proxyfleet"
		}
		w("auth_param basic program %s %s", a.Helper, a.PasswordFile)
		w("auth_param basic realm %s", realm)
		w("auth_param basic children 5 startup=1 idle=1")
		w("auth_param basic credentialsttl 1 hour")
		w("acl proxyfleet_auth proxy_auth REQUIRED")
	}
	// The gate: the client's address and login only, never the destination.
	if len(s.Clients) > 0 {
		w("http_access deny !proxyfleet_clients")
	}
	if s.Auth != nil {
		w("http_access deny !proxyfleet_auth")
	}
	w("http_access deny manager")
	w("http_access deny !Safe_ports")
	w("http_access deny CONNECT !SSL_ports")
	w("http_access deny to_localhost")
	w("http_access deny proxyfleet_denied")
	if s.Auth != nil {
		w("http_access allow proxyfleet_clients proxyfleet_auth")
	} else {
		w("http_access allow proxyfleet_clients")
	}
	w("http_access deny all")
	w("icp_access deny all")
	w("htcp_access deny all")
	w("")
	// WebSocket handshakes (GET with Upgrade: websocket) are carried on the
	// ports http_access allows above and no others; Squid matches the
	// protocol name case-sensitively, and clients write it both ways.
	w("http_upgrade_request_protocols websocket allow all")
	w("http_upgrade_request_protocols WebSocket allow all")
	w("via off")
	w("forwarded_for delete")
	w("httpd_suppress_version_string on")
	return b.String()
}

// MergePrefixes drops duplicates and every prefix inside another one. Squid
// resolves an overlap in one ACL by ignoring the LARGER range ("is a
// subnetwork of ... is ignored"), so a cluster CIDR inside 10.0.0.0/8 would
// otherwise reopen the rest of 10.0.0.0/8.
func MergePrefixes(in []netip.Prefix) []netip.Prefix {
	ps := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		ps = append(ps, p.Masked())
	}
	sort.Slice(ps, func(i, j int) bool {
		if c := ps[i].Addr().Compare(ps[j].Addr()); c != 0 {
			return c < 0
		}
		return ps[i].Bits() < ps[j].Bits()
	})
	var out []netip.Prefix
	for _, p := range ps {
		covered := false
		for _, q := range out {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	return out
}

// JoinPrefixes is the space-separated list Squid ACLs take.
func JoinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}
