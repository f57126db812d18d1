package daemon

import (
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/proxyfleet/proxyfleet/pool"
)

// printUsage tells the person who just started the gateway how to use it.
// It shows where the token goes, never a token.
func printUsage(w io.Writer, cfg *Config, members []pool.Member, proxyLn, apiLn, metricsLn, statusLn net.Listener) {
	addr := reachableAddr(proxyLn.Addr())
	proxyURL := "http://" + addr
	if len(cfg.Clients) > 0 {
		proxyURL = "http://crawler:$TOKEN@" + addr
	}
	var b strings.Builder
	if cfg.PoolAPI != "" {
		fmt.Fprintf(&b, "proxyfleet gateway listening on %s leasing from the lease API %s, rotation %s\n",
			proxyLn.Addr(), cfg.PoolAPI, cfg.Mode)
	} else {
		noun := "members"
		if len(members) == 1 {
			noun = "member"
		}
		fmt.Fprintf(&b, "proxyfleet gateway listening on %s with %d %s (%s), rotation %s\n",
			proxyLn.Addr(), len(members), noun, memberNames(members), cfg.Mode)
	}
	if len(cfg.Clients) > 0 {
		fmt.Fprintf(&b, "  TOKEN=<a token from %s>\n", or(cfg.Names.Clients, "Clients"))
	}
	fmt.Fprintf(&b, "  export HTTPS_PROXY=%s HTTP_PROXY=%s\n", proxyURL, proxyURL)
	fmt.Fprintf(&b, "  curl -x %s https://example.com\n", proxyURL)
	user := "crawler"
	if len(cfg.Clients) > 0 {
		user += "-session-s1:$TOKEN"
	} else {
		user += "-session-s1:"
	}
	fmt.Fprintf(&b, "  curl -x http://%s -U '%s' https://example.com   # pin a session\n", addr, user)
	if apiLn != nil {
		fmt.Fprintf(&b, "  lease API: http://%s/v1/proxies   (proxyfleet lease list --api http://%s)\n",
			reachableAddr(apiLn.Addr()), reachableAddr(apiLn.Addr()))
	}
	if metricsLn != nil {
		fmt.Fprintf(&b, "  metrics:   http://%s/metrics\n", reachableAddr(metricsLn.Addr()))
	}
	switch {
	case statusLn != nil:
		fmt.Fprintf(&b, "  status:    http://%s/status\n", reachableAddr(statusLn.Addr()))
	case metricsLn != nil && StatusServedOn(metricsLn.Addr()):
		fmt.Fprintf(&b, "  status:    http://%s/status\n", reachableAddr(metricsLn.Addr()))
	case metricsLn != nil:
		fmt.Fprintf(&b, "  status:    not served: %s is not loopback (give %s)\n", or(cfg.Names.MetricsListen, "MetricsListen"), or(cfg.Names.StatusListen, "StatusListen"))
	}
	_, _ = io.WriteString(w, b.String())
}

// memberNames lists the first five members' names, then how many more.
func memberNames(members []pool.Member) string {
	names := make([]string, 0, len(members))
	for i, m := range members {
		if i == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(members)-5))
			break
		}
		names = append(names, m.Name)
	}
	return strings.Join(names, ", ")
}

// reachableAddr is a listener's address as a local client would dial it: an
// unspecified host (0.0.0.0, ::) becomes loopback.
func reachableAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		if tcp.IP != nil && tcp.IP.To4() == nil {
			return net.JoinHostPort("::1", fmt.Sprint(tcp.Port))
		}
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return tcp.String()
}
