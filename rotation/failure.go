package rotation

import (
	"strconv"
	"strings"
)

// Fault says whose failure a failed attempt through an upstream was. The
// distinction decides how much of the pool a failure takes out of service:
// a crawler follows dead links all day, and a dead site must never take a
// member out for every other site.
type Fault uint8

const (
	// FaultMember is evidence about the member itself: the connection to it
	// was refused, reset or timed out, its TLS or SOCKS5 handshake failed,
	// it refused our credentials (407), it said it is shutting down or out
	// of sockets, or it answered in a way no proxy would. The member rests
	// for every target (ResultUpstreamFailed).
	FaultMember Fault = iota + 1
	// FaultSite is the upstream answering about the site: it could not
	// resolve, reach or talk to it, or its policy refuses it. The member
	// stays in service; only the {member, site} pair rests briefly
	// (ResultTargetUnreachable).
	FaultSite
)

// Failure is the verdict on one failed attempt through an upstream.
type Failure struct {
	Fault Fault
	// Class names the way it failed ("dns", "connect", "access", "timeout",
	// "status 500", ...). Two members failing one site with the same Class
	// tell that the site is down, so no further member is tried.
	Class string
}

// Member and Site build Failures; their Class is for messages and for the
// "same way on two members" rule.
func Member(class string) Failure { return Failure{Fault: FaultMember, Class: class} }

// Site is a FaultSite Failure of the given class.
func Site(class string) Failure { return Failure{Fault: FaultSite, Class: class} }

// Result is what the failure reports to the pool.
func (f Failure) Result() Result {
	if f.Fault == FaultSite {
		return ResultTargetUnreachable
	}
	return ResultUpstreamFailed
}

// UpstreamError is what an upstream said about a failure in its own words:
// the error headers proxies put on the answers they make themselves.
// Every field is the raw header value, "" when absent.
type UpstreamError struct {
	// ProxyStatus is RFC 9209's Proxy-Status (the standard form, also sent
	// by commercial gateways that adopted it).
	ProxyStatus string
	// SquidError is Squid's X-Squid-Error ("ERR_DNS_FAIL 0").
	SquidError string
	// BrightDataCode is Bright Data's x-brd-err-code.
	BrightDataCode string
}

// Marked reports whether the upstream marked the answer as its own: a
// plain-HTTP answer carrying one of these headers came from the upstream,
// not from the site, so it is the upstream's word about the site.
func (e UpstreamError) Marked() bool {
	return proxyStatusError(e.ProxyStatus) != "" || squidCode(e.SquidError) != "" || brdCode(e.BrightDataCode) != ""
}

// Reason is the upstream's own name for the failure, for the client's
// message ("" when it gave none).
func (e UpstreamError) Reason() string {
	if v := proxyStatusError(e.ProxyStatus); v != "" {
		return "Proxy-Status error=" + v
	}
	if v := squidCode(e.SquidError); v != "" {
		return "X-Squid-Error " + v
	}
	if v := brdCode(e.BrightDataCode); v != "" {
		return "x-brd-err-code " + v
	}
	return ""
}

// UpstreamAnswer classifies an upstream's own non-2xx answer: its answer
// to our CONNECT, or a plain-HTTP answer it marked as its own. Only a 407
// (our credentials) and the error names that describe the proxy itself are
// the member's fault; everything else — DNS, connect and access failures,
// 502/503/504, and any status without an error name — is about the site.
// A member that is broken for everyone is caught by MemberEvidence instead:
// other members reach the sites it fails.
func UpstreamAnswer(status int, e UpstreamError) Failure {
	if status == 407 {
		return Member("auth")
	}
	if v := proxyStatusError(e.ProxyStatus); v != "" {
		return classifyProxyStatus(v)
	}
	if v := squidCode(e.SquidError); v != "" {
		return classifySquid(v)
	}
	if v := brdCode(e.BrightDataCode); v != "" {
		// Bright Data's codes name account, zone and destination problems;
		// none of them says the super proxy itself is down.
		return Site("brd " + v)
	}
	return Site("status " + strconv.Itoa(status))
}

// classifySquid reads an X-Squid-Error code. The few codes about Squid
// itself are the member's; unknown codes count as about the site.
func classifySquid(code string) Failure {
	switch code {
	case "ERR_CACHE_ACCESS_DENIED", "ERR_CACHE_MGR_ACCESS_DENIED":
		return Member("auth")
	case "ERR_SHUTTING_DOWN", "ERR_SOCKET_FAILURE", "ERR_ICAP_FAILURE":
		return Member(strings.ToLower(strings.TrimPrefix(code, "ERR_")))
	case "ERR_DNS_FAIL":
		return Site("dns")
	case "ERR_CONNECT_FAIL":
		return Site("connect")
	case "ERR_SECURE_CONNECT_FAIL":
		return Site("tls")
	case "ERR_ACCESS_DENIED", "ERR_FORWARDING_DENIED", "ERR_CONFLICT_HOST":
		return Site("access")
	case "ERR_READ_TIMEOUT", "ERR_LIFETIME_EXP":
		return Site("timeout")
	}
	return Site(strings.ToLower(strings.TrimPrefix(code, "ERR_")))
}

// classifyProxyStatus reads an RFC 9209 error type (section 2.3). The
// intermediary's own trouble is the member's; the next hop's is the site's.
func classifyProxyStatus(v string) Failure {
	switch v {
	case "proxy_internal_error", "proxy_configuration_error", "proxy_loop_detected", "connection_limit_reached":
		return Member(v)
	case "dns_timeout", "dns_error", "destination_not_found":
		return Site("dns")
	case "connection_refused", "destination_unavailable", "destination_ip_unroutable":
		return Site("connect")
	case "connection_timeout", "connection_read_timeout", "connection_write_timeout", "http_response_timeout":
		return Site("timeout")
	case "destination_ip_prohibited", "http_request_denied":
		return Site("access")
	case "tls_protocol_error", "tls_certificate_error", "tls_alert_received":
		return Site("tls")
	}
	return Site(v)
}

// proxyStatusError returns the error parameter of the last member of a
// Proxy-Status list (the proxy nearest to us speaks last), lower-cased;
// "" when there is none.
func proxyStatusError(v string) string {
	if v == "" {
		return ""
	}
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	for _, p := range strings.Split(v, ";")[1:] {
		k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "error") {
			continue
		}
		val = strings.Trim(strings.TrimSpace(val), `"`)
		if !isToken(val) {
			return ""
		}
		return strings.ToLower(val)
	}
	return ""
}

// squidCode returns the ERR_* code of an X-Squid-Error value ("ERR_DNS_FAIL
// 0" → "ERR_DNS_FAIL"), "" when it is not one.
func squidCode(v string) string {
	v = strings.TrimSpace(v)
	if i := strings.IndexByte(v, ' '); i >= 0 {
		v = v[:i]
	}
	if len(v) < 5 || !strings.HasPrefix(v, "ERR_") || !isToken(v) {
		return ""
	}
	return v
}

// brdCode returns a Bright Data error code, lower-cased; "" when absent or
// not a plain code.
func brdCode(v string) string {
	v = strings.TrimSpace(v)
	if !isToken(v) {
		return ""
	}
	return strings.ToLower(v)
}

// isToken accepts the characters error names are made of, so a hostile
// header cannot smuggle text into a Class or a client message.
func isToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// SOCKSReply classifies a SOCKS5 CONNECT reply code other than success
// (RFC 1928 section 6). Refusals and unreachable hosts or networks are
// about the site; a server that does not support what every SOCKS5 server
// must is the member's.
func SOCKSReply(rep byte) Failure {
	switch rep {
	case 2:
		return Site("access")
	case 3, 4, 5:
		return Site("connect")
	case 6:
		return Site("timeout")
	case 7, 8:
		return Member("socks5 reply " + strconv.Itoa(int(rep)))
	}
	return Site("socks5 reply " + strconv.Itoa(int(rep)))
}
