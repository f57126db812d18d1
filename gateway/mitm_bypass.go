package gateway

import (
	"errors"
	"net/netip"
	"strings"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
)

// HostPatterns are the hosts MITM leaves alone (--mitm-bypass): sites that
// pin their certificate or want the client's own certificate (mutual TLS)
// break when the gateway terminates their TLS, so they stay plain tunnels.
type HostPatterns struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
}

// ParseHostPatterns reads patterns: a host name (`example.com`, that host
// only), `*.example.com` (every name below example.com, not example.com
// itself), or an IP literal. Case and a trailing dot are ignored. Anything
// else — a port, a path, a wildcard elsewhere, an IPv6 zone — is an error
// naming it.
func ParseHostPatterns(patterns []string) (HostPatterns, error) {
	hp := HostPatterns{exact: map[string]bool{}}
	for _, raw := range patterns {
		key, wild, err := parseHostPattern(raw)
		if err != nil {
			return HostPatterns{}, err
		}
		if wild {
			hp.suffixes = append(hp.suffixes, key)
		} else {
			hp.exact[key] = true
		}
	}
	return hp, nil
}

// parseHostPattern reads one host pattern: key is the host (or IP) it
// names, or for *.domain the suffix ".domain" every name below it ends in.
func parseHostPattern(raw string) (key string, wild bool, err error) {
	p := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(raw), "."))
	if a, err := netip.ParseAddr(strings.Trim(p, "[]")); err == nil {
		if a.Zone() != "" {
			// A zone (fe80::1%eth0) names an interface of the machine
			// that reads the address, not a site; and lower-casing it
			// above would change it (zones are case-sensitive).
			return "", false, errors.New("host pattern " + echo.Quote(raw) + ": an IP address with a zone (%) names a local interface, not a site")
		}
		return a.Unmap().String(), false, nil
	}
	name, wild := strings.CutPrefix(p, "*.")
	if !validHostName(name) {
		return "", false, errors.New("host pattern " + echo.Quote(raw) + ": want a host name, *.domain or an IP address")
	}
	if wild {
		return "." + name, true, nil
	}
	return name, false, nil
}

// matchKey is host as patterns name it: lower case, no final dot, an IP
// address in its canonical form.
func matchKey(host string) string {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// validHostName accepts dot-separated labels of letters, digits, '-' and '_'.
func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Match reports whether host (as in a CONNECT authority, without port) is
// one of the patterns.
func (hp HostPatterns) Match(host string) bool {
	h := matchKey(host)
	if hp.exact[h] {
		return true
	}
	for _, s := range hp.suffixes {
		if strings.HasSuffix(h, s) {
			return true
		}
	}
	return false
}
