// Package hop is what of a request's or an answer's header travels on
// through the gateway: no hop-by-hop field (RFC 9110 7.6.1), nothing the
// message's Connection names, and no X-Proxyfleet-* field, which only the
// gateway itself reads (a client's) or writes (its own answers'). Pure;
// it knows nothing of members or requests.
package hop

import (
	"net/http"
	"strings"

	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/params"
)

// IsHopByHop reports headers that belong to one connection (RFC 9110 7.6.1)
// or to the client↔proxy hop, in canonical form.
func IsHopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// ForwardHeader copies the request headers that travel on: no hop-by-hop
// header, nothing Connection names, no X-Proxyfleet-* header. Value slices
// are shared, not copied; neither side modifies them. A request without a
// User-Agent goes on without one: every request writer (net/http's, the
// lean one, HTTP/2's) would add its own Go-http-client, a fingerprint of
// the gateway the client never sent, unless the field is there and empty.
func ForwardHeader(in http.Header) http.Header {
	out := make(http.Header, len(in)+1)
	conn := in["Connection"]
	for k, vv := range in {
		if IsHopByHop(k) || strings.HasPrefix(k, params.HeaderPrefix) || (len(conn) > 0 && front.HasToken(conn, k)) {
			continue
		}
		out[k] = vv
	}
	if _, ok := out["User-Agent"]; !ok {
		out["User-Agent"] = noUserAgent
	}
	return out
}

// noUserAgent is the User-Agent of a request that named none: present and
// empty, so that no writer adds its own (shared, never modified).
var noUserAgent = []string{""}

// CopyResponseHeader copies an answer's end-to-end headers into dst; a
// site's own X-Proxyfleet-* headers are dropped so they cannot pose as ours.
func CopyResponseHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if EndToEnd(k, conn) {
			dst[k] = vv
		}
	}
}

// EndToEnd reports whether an answer's field k (canonical) goes on to the
// client: not hop-by-hop, not named by the answer's Connection (conn), not
// an X-Proxyfleet-* field, which only the gateway writes.
func EndToEnd(k string, conn []string) bool {
	return !IsHopByHop(k) && !strings.HasPrefix(k, params.HeaderPrefix) && (len(conn) == 0 || !front.HasToken(conn, k))
}
