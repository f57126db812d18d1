// Package fault is the vocabulary every stage of the gateway's request
// path classifies its failures in: the reasons and outcomes of the
// gateway's own answers (with each reason's status and RFC 9209 error
// type), a failed attempt through a member with its verdict (Attempt:
// the member's or the site's), a member's own non-2xx answer, a refused
// target, a fault of the client's, and the site failures one request
// collected. A stage makes these where a failure happens; the gateway's
// one policy (judge) reads them. Pure: it does no I/O and knows no stage.
package fault

import "net/http"

// Outcomes passed to the gateway's Recorder.Request, one per client request or tunnel.
// A relayed answer's outcome says what the site answered; an answer the
// gateway made itself has its reason as its outcome (one name,
// in the metric, the span and the status page's chart), so a dead site is
// counted as target_unreachable, never as a member's upstream_failed. A
// client that left before its answer is client_gone.
const (
	OutcomeOK          = "ok"           // the site's answer (or the tunnel) was delivered
	OutcomeRateLimited = "rate_limited" // the delivered answer was a rate-limit status
	OutcomeBanned      = "banned"       // the delivered answer was a ban status
	OutcomeClientGone  = "client_gone"  // the client went away before the answer (or mid-body)
)

// Reasons: the X-Proxyfleet-Reason of the answers the gateway makes itself.
// AnswerStatus maps each to its status, the one place that does.
const (
	ReasonBadRequest        = "bad_request"        // 400: not a proxy request, bad authority, unsupported scheme, malformed body
	ReasonClientTimeout     = "client_timeout"     // 408: the client stopped sending its request body
	ReasonPrivateTarget     = "private_target"     // 403: the target is in a refused range
	ReasonAuth              = "auth"               // 407: missing or wrong client token
	ReasonBadParams         = "bad_params"         // 407: malformed username or header parameters
	ReasonDNS               = "dns"                // 502: the target's name does not resolve
	ReasonTargetUnreachable = "target_unreachable" // 502: the site cannot be reached (the members say so)
	ReasonUpstreamFailed    = "upstream_failed"    // 502: every member tried failed itself
	ReasonSiteCertificate   = "site_certificate"   // 502: MITM or https:// URI: the site's certificate does not verify
	ReasonNoMember          = "no_member"          // 503: the pool has no usable member
	ReasonPoolUnreachable   = "pool_unreachable"   // 503: the --lease-api does not answer
	ReasonPoolError         = "pool_error"         // 503: the pool refused the lease
	ReasonPoolForbidden     = "pool_forbidden"     // 403: the lease was refused (no right to lease, not shared with its namespace, outside the token client's allowance)
	ReasonQuota             = "quota_exceeded"     // 429: a token client is past one of its quotas (leases, rps, site-rps)
	ReasonShuttingDown      = "shutting_down"      // 503: the gateway is draining
	ReasonPaced             = "paced"              // 503: the site's pace left no slot within --pacing-max-wait
	ReasonSessionLost       = "session_lost"       // 502: a strict session's member was banned, failed or left
	ReasonSessionLimit      = "session_limit"      // 503: the gateway holds its maximum of live sticky sessions
	ReasonOverloaded        = "gateway_overloaded" // 503: the gateway could not open a connection of its own (descriptors, buffers)
	ReasonTimeout           = "timeout"            // 504: no answer within the request deadline
	ReasonMemberTimeout     = "member_timeout"     // 504: the members tried gave no answer within the answer timeout
	ReasonLoop              = "loop"               // 508: the request targets the gateway itself
	ReasonInternal          = "internal"           // 500: the gateway's own failure
)

// AnswerStatus is the HTTP status of the gateway's answer with reason (an
// X-Proxyfleet-Reason); 500 for one it does not know.
func AnswerStatus(reason string) int {
	switch reason {
	case ReasonBadRequest:
		return http.StatusBadRequest
	case ReasonClientTimeout:
		return http.StatusRequestTimeout
	case ReasonPrivateTarget, ReasonPoolForbidden:
		return http.StatusForbidden
	case ReasonAuth, ReasonBadParams:
		return http.StatusProxyAuthRequired
	case ReasonQuota:
		return http.StatusTooManyRequests
	case ReasonDNS, ReasonTargetUnreachable, ReasonUpstreamFailed, ReasonSiteCertificate:
		return http.StatusBadGateway
	case ReasonNoMember, ReasonPoolUnreachable, ReasonPoolError, ReasonShuttingDown, ReasonPaced, ReasonSessionLimit, ReasonOverloaded:
		return http.StatusServiceUnavailable
	case ReasonSessionLost:
		return http.StatusBadGateway
	case ReasonTimeout, ReasonMemberTimeout:
		return http.StatusGatewayTimeout
	case ReasonLoop:
		return 508
	}
	return http.StatusInternalServerError
}

// ProxyStatusError is the RFC 9209 error type of the gateway's answer with
// reason, which it sends as Proxy-Status with the reason as its details:
// a client, or another gateway that has this one as a member, reads from
// it whose failure the answer is without knowing proxyfleet's reasons.
// The types are chosen for what rotation.UpstreamAnswer makes of them, so
// that a chain of gateways blames as one gateway would: the site's
// failures (dns, target_unreachable, site_certificate, timeouts) as the
// site's; the gateway's own trouble (its pool unreachable, every one of
// its upstreams failed, its pool refusing its identity, draining,
// overloaded, a bug) as that member's;
// no_member and the request-bound refusals (paced, session_lost) as the
// site's through that member (destination_unavailable, http_request_denied),
// since they say nothing of the gateway's other sites.
func ProxyStatusError(reason string) string {
	switch reason {
	case ReasonDNS:
		return "dns_error"
	case ReasonTargetUnreachable, ReasonNoMember:
		return "destination_unavailable"
	case ReasonSiteCertificate:
		return "tls_certificate_error"
	case ReasonTimeout, ReasonMemberTimeout:
		return "http_response_timeout"
	case ReasonPrivateTarget:
		return "destination_ip_prohibited"
	case ReasonPaced, ReasonSessionLost, ReasonAuth:
		return "http_request_denied"
	case ReasonBadRequest, ReasonBadParams, ReasonClientTimeout:
		return "http_request_error"
	case ReasonSessionLimit, ReasonOverloaded, ReasonQuota:
		// A quota is the gateway's limit on its client, whatever the
		// site: to a chaining gateway, that member's own.
		return "connection_limit_reached"
	case ReasonLoop:
		return "proxy_loop_detected"
	}
	// upstream_failed, pool_unreachable, pool_error, shutting_down, internal.
	return "proxy_internal_error"
}

// proxyStatusName is the gateway's name in a Proxy-Status list.
const proxyStatusName = "proxyfleet"

// ProxyStatus is the Proxy-Status value of the gateway's answer with
// reason: its name, the RFC 9209 error type and the reason as details.
func ProxyStatus(reason string) string {
	return proxyStatusName + "; error=" + ProxyStatusError(reason) + `; details="` + reason + `"`
}
