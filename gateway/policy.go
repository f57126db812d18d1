package gateway

import (
	"errors"
	"syscall"

	"github.com/proxyfleet/proxyfleet/gateway/admission"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// rejectionOutcome is the outcome of a request the front end ended before
// the gateway saw it.
var rejectionOutcome = map[front.Rejection]string{
	front.Malformed: fault.ReasonBadRequest,
	front.Gone:      fault.OutcomeClientGone,
	front.Stalled:   fault.ReasonClientTimeout,
}

// answerFor is the status and outcome of an answer with reason: the
// outcome is the reason itself.
func answerFor(reason string) (status int, outcome string) {
	return fault.AnswerStatus(reason), reason
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

// poolConfigError is the gateway's own --lease-ttl above the pool's
// maximum: a configuration mismatch, never the client's fault.
type poolConfigError struct{ err error }

func (e *poolConfigError) Error() string { return e.err.Error() }

// givenUp ends a request after the members tried: the last attempt
// decides the reason, everything was already reported.
type givenUp struct {
	last *fault.Attempt
	msg  string
}

func (e *givenUp) Error() string { return e.msg }

// judge is the failure policy: the one place that turns a failed request
// step into its answer, its metric and what the pool hears. It is pure.
func judge(err error) verdict {
	var (
		te  *fault.Target
		ae  *fault.Attempt
		gu  *givenUp
		au  *admission.AuthError
		bp  *params.Error
		pce *poolConfigError
		nm  *pool.NoMatchError
		cf  *fault.Client
		pe  *pacing.Error
		sl  *sessionLostError
		sm  *sessionLimitError
		qe  *quotaError
	)
	switch {
	case errors.As(err, &cf):
		// First: whatever else the error carries, the client caused it. The
		// lease is let go unreported, and no member or site rests.
		return verdict{reason: cf.Reason, outcome: cf.Outcome, closeConn: true}
	case errors.As(err, &au):
		return answer(fault.ReasonAuth)
	case errors.As(err, &bp):
		// The username, a parameter header or the credentials' form.
		return answer(fault.ReasonBadParams)
	case errors.As(err, &sl):
		// Its lease was reported and let go already.
		return answer(fault.ReasonSessionLost)
	case errors.As(err, &pe):
		// The gateway's own pace held the request: nothing was sent.
		return answer(fault.ReasonPaced)
	case errors.As(err, &sm):
		// Nothing was leased or sent.
		return answer(fault.ReasonSessionLimit)
	case errors.As(err, &qe):
		// A token client past its quota: nothing was leased or sent, and
		// no member or site is blamed.
		return answer(fault.ReasonQuota)
	case errors.As(err, &te):
		return answer(te.Reason)
	case errors.Is(err, errRequestTimeout):
		// A slow site is not the member's failure: nothing is reported.
		return answer(fault.ReasonTimeout)
	case errors.Is(err, errShuttingDown):
		return answer(fault.ReasonShuttingDown)
	case ownResourcesExhausted(err):
		// The gateway's own socket(2) or connect(2) found no descriptor
		// or buffer: every member would fail the same way, and none is
		// at fault, so none rests and none is tried.
		return answer(fault.ReasonOverloaded)
	case errors.As(err, &gu):
		return answer(faultReason(gu.last))
	case errors.As(err, &ae):
		if ae.Firsthand && ae.F.Fault == rotation.FaultSite {
			// A direct member dialled the site itself, or the gateway
			// verified the site's certificate itself: another member
			// would not help, and this one is fine.
			return answer(faultReason(ae))
		}
		v := answer(faultReason(ae))
		v.report, v.retry = ae.F.Result(), true
		return v
	case errors.As(err, &nm):
		return answer(fault.ReasonNoMember)
	case errors.As(err, &pce):
		return answer(fault.ReasonPoolError)
	case errors.Is(err, pool.ErrTTLTooLong):
		return answer(fault.ReasonBadParams)
	case errors.Is(err, pool.ErrUnreachable):
		return answer(fault.ReasonPoolUnreachable)
	case errors.Is(err, pool.ErrForbidden):
		// The client is refused for what it is (a sidecar's service
		// account without the lease binding), not for want of a member:
		// no retry, no member blamed.
		return answer(fault.ReasonPoolForbidden)
	case errors.Is(err, errLeaseFailed):
		return answer(fault.ReasonPoolError)
	}
	return answer(fault.ReasonInternal)
}

// outcomeOf is the outcome of a delivered site answer that the classifier
// read as res.
func outcomeOf(res rotation.Result) string {
	switch res {
	case rotation.ResultRateLimited:
		return fault.OutcomeRateLimited
	case rotation.ResultBanned:
		return fault.OutcomeBanned
	}
	return fault.OutcomeOK
}

func answer(reason string) verdict {
	_, outcome := answerFor(reason)
	return verdict{reason: reason, outcome: outcome}
}

// faultReason is the answer to a failed attempt that ends the request.
func faultReason(ae *fault.Attempt) string {
	if ae != nil && ae.F.Fault == rotation.FaultSite {
		switch ae.F.Class {
		case fault.ClassCertificate:
			return fault.ReasonSiteCertificate
		case fault.ClassAnswerTimeout:
			return fault.ReasonMemberTimeout
		}
		return fault.ReasonTargetUnreachable
	}
	return fault.ReasonUpstreamFailed
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
