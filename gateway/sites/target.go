package sites

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
)

// SplitTarget validates a CONNECT authority or URL host: a non-empty host
// and a numeric port in 1..65535.
func SplitTarget(hostport, defaultPort string) (host string, port uint16, err error) {
	h, p, serr := net.SplitHostPort(hostport)
	if serr != nil {
		if defaultPort == "" {
			return "", 0, &fault.Target{Reason: fault.ReasonBadRequest, Msg: "target " + echo.Quote(hostport) + " is not host:port"}
		}
		h, p = hostport, defaultPort
		if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
			h = h[1 : len(h)-1]
		}
	}
	n, perr := strconv.ParseUint(p, 10, 16)
	if h == "" || perr != nil || n == 0 {
		return "", 0, &fault.Target{Reason: fault.ReasonBadRequest, Msg: "target " + echo.Quote(hostport) + " is not host:port"}
	}
	if _, err := netip.ParseAddr(h); err != nil && !ValidHostName(strings.ToLower(strings.TrimSuffix(h, "."))) {
		// Refused here, the client's: sent on, a member would refuse it
		// and the refusal would read as the site's or the member's.
		return "", 0, &fault.Target{Reason: fault.ReasonBadRequest, Msg: "target host " + echo.Quote(h) + " is neither an IP address nor a host name"}
	}
	return h, uint16(n), nil
}
