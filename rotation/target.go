package rotation

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
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

// maxHostLen bounds a target's host: the longest DNS name (253) plus room
// for an IPv6 literal's zone is well below it.
const maxHostLen = 255

// ParseTarget is TargetKey for a target from outside (the lease API's
// acquire, report and pace): host, host:port, [IPv6]:port or a bare IP
// literal, and nothing else. A URL (https://example.com/x), a path, a
// login, a space or an empty host is an error saying what is wrong, where
// TargetKey would have made a key of it ("https://example.com/x" splits at
// its last ':' into the host "https"), so a crawler that passes a URL by
// mistake cools down nothing, silently.
func ParseTarget(s string) (string, error) {
	if strings.Contains(s, "://") {
		return "", errors.New("is a URL; give the site's host (example.com or example.com:443)")
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune("/@?#%\\", r) }); i >= 0 {
		return "", fmt.Errorf("has %q at %d; give a host, host:port or an IP literal", s[i], i)
	}
	host := s
	if h, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return "", fmt.Errorf("port %q is not 1 to 65535", port)
		}
		host = h
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	} else if strings.Count(s, ":") == 1 || strings.ContainsAny(s, "[]") {
		return "", errors.New("is not host:port: " + strings.TrimPrefix(err.Error(), "address "+s+": "))
	}
	switch {
	case host == "":
		return "", errors.New("has an empty host")
	case len(host) > maxHostLen:
		return "", fmt.Errorf("host is longer than %d bytes", maxHostLen)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if strings.Contains(host, ":") {
			return "", fmt.Errorf("host %q is neither a name nor an IP address", host)
		}
		for i := 0; i < len(host); i++ {
			if c := host[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
				return "", fmt.Errorf("host %q has %q: a name is letters, digits, '-', '_' and '.' (IDNs in their xn-- form)", host, c)
			}
		}
		for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
			if label == "" || len(label) > 63 {
				return "", fmt.Errorf("host %q has an empty label or one longer than 63 bytes", host)
			}
		}
	}
	return HostKey(host), nil
}
