package providers

import "errors"

// The error taxonomy. Providers wrap every error they return with exactly one
// of these (fmt.Errorf("%w: ...", ErrPermanent, ...)) and the reconciler acts
// on Class(err) alone, never on backend-specific error types.
var (
	// ErrTransient: retrying the same call later may succeed (timeouts,
	// throttling, 5xx, conflicts). The reconciler returns the error so the
	// workqueue backs off exponentially.
	ErrTransient = errors.New("transient provider error")
	// ErrPermanent: retrying the same call will fail the same way until a human
	// changes something (invalid spec, permission denied). The reconciler
	// latches the Proxy as Failed until its spec changes.
	ErrPermanent = errors.New("permanent provider error")
	// ErrQuotaExceeded: the backend is full for now (quota, capacity). The
	// reconciler waits a long, fixed interval without logging an error and
	// never marks the Proxy Failed.
	ErrQuotaExceeded = errors.New("provider quota exceeded")
	// ErrNotFound: the instance does not exist. From Get it means "create it
	// again"; Delete never returns it.
	ErrNotFound = errors.New("instance not found")
)

// sentinels in the order Class prefers them when two sit at the same depth.
var sentinels = []error{ErrNotFound, ErrQuotaExceeded, ErrPermanent, ErrTransient}

// Class returns which of ErrTransient, ErrPermanent, ErrQuotaExceeded or
// ErrNotFound err belongs to, or nil for a nil err.
//
// When err wraps more than one sentinel, the one closest to the surface of the
// wrap tree wins: a provider that wraps a backend's permanent-looking error in
// ErrTransient means Transient. Among sentinels at the same depth the order is
// NotFound, QuotaExceeded, Permanent, Transient.
//
// An error that wraps none of them is ErrTransient: retrying with backoff is
// the safe default, because treating an unknown failure as permanent would
// latch a Proxy as Failed on what may be a network blip, while a wrongly
// retried permanent error only costs a few calls on the backoff curve.
func Class(err error) error {
	if err == nil {
		return nil
	}
	level := []error{err}
	for len(level) > 0 {
		for _, s := range sentinels {
			for _, e := range level {
				if e == s {
					return s
				}
			}
		}
		var next []error
		for _, e := range level {
			switch u := e.(type) {
			case interface{ Unwrap() error }:
				if inner := u.Unwrap(); inner != nil {
					next = append(next, inner)
				}
			case interface{ Unwrap() []error }:
				for _, inner := range u.Unwrap() {
					if inner != nil {
						next = append(next, inner)
					}
				}
			}
		}
		level = next
	}
	return ErrTransient
}

// Result values of provider_requests_total{result}.
const (
	ResultOK            = "ok"
	ResultTransient     = "transient"
	ResultPermanent     = "permanent"
	ResultQuotaExceeded = "quota_exceeded"
	ResultNotFound      = "not_found"
)

// ResultLabel maps err to its metrics label: "ok" for nil, else its Class.
func ResultLabel(err error) string {
	switch Class(err) {
	case nil:
		return ResultOK
	case ErrNotFound:
		return ResultNotFound
	case ErrQuotaExceeded:
		return ResultQuotaExceeded
	case ErrPermanent:
		return ResultPermanent
	default:
		return ResultTransient
	}
}
