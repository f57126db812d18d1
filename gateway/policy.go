package gateway

import (
	"errors"
	"net/http"
	"syscall"

	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Outcomes passed to Recorder.Request, one per client request or tunnel.
// A relayed answer's outcome says what the site answered; an answer the
// gateway made itself has its reason as its outcome (answerFor: one name,
// in the metric, the span and the status page's chart), so a dead site is
// counted as target_unreachable, never as a member's upstream_failed. A
// client that left before its answer is client_gone.
const (
	OutcomeOK          = "ok"           // the site's answer (or the tunnel) was delivered
	OutcomeRateLimited = "rate_limited" // the delivered answer was a rate-limit status
	OutcomeBanned      = "banned"       // the delivered answer was a ban status
	OutcomeClientGone  = "client_gone"  // the client went away before the answer (or mid-body)
)

// rejectionOutcome is the outcome of a request the front end ended before
// the gateway saw it.
var rejectionOutcome = map[front.Rejection]string{
	front.Malformed: ReasonBadRequest,
	front.Gone:      OutcomeClientGone,
	front.Stalled:   ReasonClientTimeout,
}

// Reasons: the X-Proxyfleet-Reason of the answers the gateway makes itself.
// answerFor maps each to its status and outcome, the one place that does.
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
	ReasonPoolForbidden     = "pool_forbidden"     // 403: the lease API refused this gateway's identity the right to lease
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

// answerFor is the status and outcome of an answer with reason: the
// outcome is the reason itself.
func answerFor(reason string) (status int, outcome string) {
	return AnswerStatus(reason), reason
}

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
	case ReasonSessionLimit, ReasonOverloaded:
		return "connection_limit_reached"
	case ReasonLoop:
		return "proxy_loop_detected"
	}
	// upstream_failed, pool_unreachable, pool_error, shutting_down, internal.
	return "proxy_internal_error"
}

// proxyStatusName is the gateway's name in a Proxy-Status list.
const proxyStatusName = "proxyfleet"

// proxyStatus is the Proxy-Status value of the gateway's answer with reason.
func proxyStatus(reason string) string {
	return proxyStatusName + "; error=" + ProxyStatusError(reason) + `; details="` + reason + `"`
}

// verdict is what a failure means for its request.
type verdict struct {
	// reason of the answer to write; "" writes none (the client left).
	reason  string
	outcome string
	// report is what the held lease is reported as before it is let go
	// ("" reports nothing: the lease is only released or kept).
	report rotation.Result
	// retry: another member may still serve the request.
	retry bool
	// closeConn: the client's connection ends after the answer (its
	// request's framing can no longer be trusted).
	closeConn bool
}

// Errors that carry no more than their kind.
var (
	// errShuttingDown: the gateway drains and takes no new tunnel.
	errShuttingDown = errors.New("gateway is shutting down")
	// errRequestTimeout is the cancel cause when Options.RequestTimeout passes.
	errRequestTimeout = errors.New("request timeout")
)

// authError is a client whose token the gateway refuses before leasing:
// 407 auth. (A malformed parameter or credential is a *params.Error: 407
// bad_params.)
type authError struct {
	err error
}

func (e *authError) Error() string { return e.err.Error() }

// poolConfigError is the gateway's own --lease-ttl above the pool's
// maximum: a configuration mismatch, never the client's fault.
type poolConfigError struct{ err error }

func (e *poolConfigError) Error() string { return e.err.Error() }

// givenUp ends a request after the members tried: the last attempt
// decides the reason, everything was already reported.
type givenUp struct {
	last *attemptError
	msg  string
}

func (e *givenUp) Error() string { return e.msg }

// judge is the failure policy: the one place that turns a failed request
// step into its answer, its metric and what the pool hears. It is pure.
func judge(err error) verdict {
	var (
		te  *targetError
		ae  *attemptError
		gu  *givenUp
		au  *authError
		bp  *params.Error
		pce *poolConfigError
		nm  *pool.NoMatchError
		cf  *clientFault
		pe  *pacedError
		sl  *sessionLostError
		sm  *sessionLimitError
	)
	switch {
	case errors.As(err, &cf):
		// First: whatever else the error carries, the client caused it. The
		// lease is let go unreported, and no member or site rests.
		return verdict{reason: cf.reason, outcome: cf.outcome, closeConn: true}
	case errors.As(err, &au):
		return answer(ReasonAuth)
	case errors.As(err, &bp):
		// The username, a parameter header or the credentials' form.
		return answer(ReasonBadParams)
	case errors.As(err, &sl):
		// Its lease was reported and let go already.
		return answer(ReasonSessionLost)
	case errors.As(err, &pe):
		// The gateway's own pace held the request: nothing was sent.
		return answer(ReasonPaced)
	case errors.As(err, &sm):
		// Nothing was leased or sent.
		return answer(ReasonSessionLimit)
	case errors.As(err, &te):
		return answer(te.reason)
	case errors.Is(err, errRequestTimeout):
		// A slow site is not the member's failure: nothing is reported.
		return answer(ReasonTimeout)
	case errors.Is(err, errShuttingDown):
		return answer(ReasonShuttingDown)
	case ownResourcesExhausted(err):
		// The gateway's own socket(2) or connect(2) found no descriptor
		// or buffer: every member would fail the same way, and none is
		// at fault, so none rests and none is tried.
		return answer(ReasonOverloaded)
	case errors.As(err, &gu):
		return answer(faultReason(gu.last))
	case errors.As(err, &ae):
		if ae.firsthand && ae.f.Fault == rotation.FaultSite {
			// A direct member dialled the site itself, or the gateway
			// verified the site's certificate itself: another member
			// would not help, and this one is fine.
			return answer(faultReason(ae))
		}
		v := answer(faultReason(ae))
		v.report, v.retry = ae.f.Result(), true
		return v
	case errors.As(err, &nm):
		return answer(ReasonNoMember)
	case errors.As(err, &pce):
		return answer(ReasonPoolError)
	case errors.Is(err, pool.ErrTTLTooLong):
		return answer(ReasonBadParams)
	case errors.Is(err, pool.ErrUnreachable):
		return answer(ReasonPoolUnreachable)
	case errors.Is(err, pool.ErrForbidden):
		// The client is refused for what it is (a sidecar's service
		// account without the lease binding), not for want of a member:
		// no retry, no member blamed.
		return answer(ReasonPoolForbidden)
	case errors.Is(err, errLeaseFailed):
		return answer(ReasonPoolError)
	}
	return answer(ReasonInternal)
}

// outcomeOf is the outcome of a delivered site answer that the classifier
// read as res.
func outcomeOf(res rotation.Result) string {
	switch res {
	case rotation.ResultRateLimited:
		return OutcomeRateLimited
	case rotation.ResultBanned:
		return OutcomeBanned
	}
	return OutcomeOK
}

func answer(reason string) verdict {
	_, outcome := answerFor(reason)
	return verdict{reason: reason, outcome: outcome}
}

// faultReason is the answer to a failed attempt that ends the request.
func faultReason(ae *attemptError) string {
	if ae != nil && ae.f.Fault == rotation.FaultSite {
		switch ae.f.Class {
		case classCertificate:
			return ReasonSiteCertificate
		case classAnswerTimeout:
			return ReasonMemberTimeout
		}
		return ReasonTargetUnreachable
	}
	return ReasonUpstreamFailed
}

// ownResourcesExhausted: err is this process running out of what opening a
// connection takes (EMFILE, ENFILE: descriptors; ENOBUFS, ENOMEM: kernel
// memory), whatever attempt or dial wrapped it. Only the gateway's own
// system calls return these errnos; a member's or a site's refusal reaches
// it as an answer or a reset, never as one of them.
func ownResourcesExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
