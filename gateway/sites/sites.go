// Package sites reads what an operator sets per site: host patterns (an
// exact host or IP, or *.domain; Hosts, the MITM bypass list), a value per
// pattern where the most specific wins (Values: the per-site answer
// timeouts, Durations, and the gateway's per-site paces), and the ports
// whose CONNECT tunnels the gateway reads as plain HTTP (ParsePorts).
// Parsing is pure and every error names the entry it refuses; it knows
// nothing of requests, members or the gateway.
package sites

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
)

// Hosts are the hosts MITM leaves alone (--mitm-bypass): sites that
// pin their certificate or want the client's own certificate (mutual TLS)
// break when the gateway terminates their TLS, so they stay plain tunnels.
type Hosts struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
}

// ParseHosts reads patterns: a host name (`example.com`, that host
// only), `*.example.com` (every name below example.com, not example.com
// itself), or an IP literal. Case and a trailing dot are ignored. Anything
// else — a port, a path, a wildcard elsewhere, an IPv6 zone — is an error
// naming it.
func ParseHosts(patterns []string) (Hosts, error) {
	hp := Hosts{exact: map[string]bool{}}
	for _, raw := range patterns {
		key, wild, err := ParsePattern(raw)
		if err != nil {
			return Hosts{}, err
		}
		if wild {
			hp.suffixes = append(hp.suffixes, key)
		} else {
			hp.exact[key] = true
		}
	}
	return hp, nil
}

// ParsePattern reads one host pattern: key is the host (or IP) it
// names, or for *.domain the suffix ".domain" every name below it ends in.
func ParsePattern(raw string) (key string, wild bool, err error) {
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
	if !ValidHostName(name) {
		return "", false, errors.New("host pattern " + echo.Quote(raw) + ": want a host name, *.domain or an IP address")
	}
	if wild {
		return "." + name, true, nil
	}
	return name, false, nil
}

// Key is host as patterns name it: lower case, no final dot, an IP
// address in its canonical form.
func Key(host string) string {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// ValidHostName accepts dot-separated labels of letters, digits, '-' and '_'.
func ValidHostName(s string) bool {
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
func (hp Hosts) Match(host string) bool {
	h := Key(host)
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

// Durations are durations set per site (--site-answer-timeout
// PATTERN=DURATION): a site known to think long before it answers (a
// report endpoint, a search that takes half a minute) gets more time than
// the default, without giving every silent member that much too.
type Durations struct{ t Values[time.Duration] }

// Values is a value per host pattern (ParseHosts' forms): an
// exact host or IP, or *.domain; the most specific pattern wins.
type Values[T any] struct {
	exact    map[string]T
	suffixes []suffix[T] // longest first
}

type suffix[T any] struct {
	suffix string // ".example.com" for "*.example.com"
	v      T
}

// Add sets v for pattern pat; entry names the whole entry for errors.
func (sp *Values[T]) Add(entry, pat string, v T) error {
	key, wild, err := ParsePattern(pat)
	if err != nil {
		return err
	}
	if sp.exact == nil {
		sp.exact = map[string]T{}
	}
	if sp.has(key, wild) {
		return errors.New("site entry " + echo.Quote(entry) + ": " + echo.Quote(strings.TrimSpace(pat)) + " is given twice")
	}
	if !wild {
		sp.exact[key] = v
		return nil
	}
	sp.suffixes = append(sp.suffixes, suffix[T]{suffix: key, v: v})
	// The most specific pattern wins: *.api.example.com before *.example.com.
	for j := len(sp.suffixes) - 1; j > 0 && len(sp.suffixes[j].suffix) > len(sp.suffixes[j-1].suffix); j-- {
		sp.suffixes[j], sp.suffixes[j-1] = sp.suffixes[j-1], sp.suffixes[j]
	}
	return nil
}

// has reports whether the pattern key (wild: a *.domain) is set.
func (sp *Values[T]) has(key string, wild bool) bool {
	if !wild {
		_, ok := sp.exact[key]
		return ok
	}
	for _, s := range sp.suffixes {
		if s.suffix == key {
			return true
		}
	}
	return false
}

// Empty reports whether no pattern is set.
func (sp *Values[T]) Empty() bool { return len(sp.exact) == 0 && len(sp.suffixes) == 0 }

// For returns the value set for host (a host name or IP literal, no
// port), and whether one is.
func (sp *Values[T]) For(host string) (T, bool) {
	var zero T
	if sp.Empty() {
		return zero, false
	}
	h := Key(host)
	if v, ok := sp.exact[h]; ok {
		return v, true
	}
	for _, s := range sp.suffixes {
		if strings.HasSuffix(h, s.suffix) {
			return s.v, true
		}
	}
	return zero, false
}

// ParseDurations reads PATTERN=DURATION entries, PATTERN as in
// ParseHosts, DURATION a positive Go duration ("40s"). A pattern
// given twice is an error, as is anything else that does not read.
func ParseDurations(entries []string) (Durations, error) {
	var sd Durations
	for _, e := range entries {
		pat, val, ok := strings.Cut(e, "=")
		if !ok {
			return Durations{}, errors.New("site entry " + echo.Quote(e) + ": want PATTERN=DURATION, e.g. slow.example.com=40s")
		}
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil || d <= 0 {
			return Durations{}, errors.New("site entry " + echo.Quote(e) + ": " + echo.Quote(val) + " is not a positive duration")
		}
		if err := sd.t.Add(e, pat, d); err != nil {
			return Durations{}, err
		}
	}
	return sd, nil
}

// For returns the duration set for host (a host name or IP literal, no
// port), and whether one is.
func (sd Durations) For(host string) (time.Duration, bool) { return sd.t.For(host) }

// DefaultConnectHTTPPorts are the ports whose CONNECT tunnels the gateway
// reads as plain HTTP itself: 80, where browsers send ws:// (a browser
// opens every WebSocket through a proxy with CONNECT) and where a
// tunnelling client sends http://. Squids refuse CONNECT to any port but
// 443, so carried as a tunnel these would fail at every generated member.
var DefaultConnectHTTPPorts = []uint16{80}

// ParsePorts reads a comma-separated list of TCP ports ("80,8080"); the
// empty string is none (an empty, non-nil slice).
func ParsePorts(s string) ([]uint16, error) {
	out := []uint16{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%s is not a port (1-65535)", echo.Quote(f))
		}
		if !slices.Contains(out, uint16(n)) {
			out = append(out, uint16(n))
		}
	}
	return out, nil
}
