package rotation

import (
	"net"
	"net/netip"
	"strings"
)

// TargetKey turns a request's host[:port] into the site key cooldowns and
// stickiness are kept under: lower-cased host, port dropped, IPv6 brackets
// dropped, trailing dot dropped, IP literals in canonical form. So
// "Example.COM.:443" and "example.com" are one site, and "[0:0::1]:80" is "::1".
func TargetKey(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	return HostKey(host)
}

// HostKey is TargetKey for a host already split from its port (no brackets):
// the gateway has split the request's host to check it, and re-splitting on
// the hot path would cost an error allocation for every port-less host.
func HostKey(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String()
	}
	return host
}
