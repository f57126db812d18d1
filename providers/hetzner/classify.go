package hetzner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/proxyfleet/proxyfleet/providers"
)

// quotaCodes are Hetzner error codes that mean "full for now": the
// project's limits or a location's capacity.
var quotaCodes = map[hcloud.ErrorCode]bool{
	hcloud.ErrorCodeResourceLimitExceeded: true,
	hcloud.ErrorCodeResourceUnavailable:   true,
	hcloud.ErrorCodePlacementError:        true,
	hcloud.ErrorCodeNoSpaceLeftInLocation: true,
}

// transientCodes are codes a later retry of the same call may pass.
var transientCodes = map[hcloud.ErrorCode]bool{
	hcloud.ErrorCodeRateLimitExceeded: true,
	hcloud.ErrorCodeConflict:          true,
	hcloud.ErrorCodeLocked:            true,
	hcloud.ErrorCodeServerError:       true,
	hcloud.ErrorCodeServiceError:      true,
	hcloud.ErrorCodeUnknownError:      true,
	hcloud.ErrorCodeBadGateway:        true,
	hcloud.ErrorCodeTimeout:           true,
	hcloud.ErrorCodeMaintenance:       true,
	hcloud.ErrorCodeRobotUnavailable:  true,
}

// classify wraps a Hetzner call's error with its taxonomy class, keeping
// the cloud's message and code in the text (they end in the Proxy's
// condition):
//
//   - resource_limit_exceeded (the project's server limit),
//     resource_unavailable, placement_error, no_space_left_in_location →
//     ErrQuotaExceeded;
//   - not_found → ErrNotFound (callers decide what absence means);
//   - rate_limit_exceeded (429), conflict, locked, server and gateway
//     errors, any 5xx, an answer without Hetzner's error body, network and
//     context errors → ErrTransient;
//   - unauthorized (a token Hetzner does not know), forbidden (a read-only
//     token), invalid_input (an unknown image, server type or location),
//     and every other code → ErrPermanent;
//   - an endpoint host that does not exist → ErrPermanent.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	hint, class := classOf(err)
	msg := err.Error()
	if hint != "" {
		msg = hint + ": " + msg
	}
	if op != "" {
		msg = op + ": " + msg
	}
	return fmt.Errorf("%w: %s", class, msg)
}

func classOf(err error) (hint string, class error) {
	var he hcloud.Error
	var dns *net.DNSError
	switch {
	case errors.Is(err, errTokenFile):
		if errors.Is(err, fs.ErrNotExist) {
			return "the token Secret is not mounted (yet)", providers.ErrTransient
		}
		return "", providers.ErrPermanent
	case errors.As(err, &he):
		switch {
		case quotaCodes[he.Code]:
			return "", providers.ErrQuotaExceeded
		case he.Code == hcloud.ErrorCodeNotFound:
			return "", providers.ErrNotFound
		case transientCodes[he.Code]:
			return "", providers.ErrTransient
		case he.Response() != nil && he.Response().StatusCode >= 500:
			return "", providers.ErrTransient
		case he.Code == hcloud.ErrorCodeUnauthorized:
			return "the API token was refused", providers.ErrPermanent
		case he.Code == hcloud.ErrorCodeForbidden:
			return "the API token may not do this (a read-only token?)", providers.ErrPermanent
		}
		return "", providers.ErrPermanent
	case errors.Is(err, hcloud.ErrStatusCode):
		// An answer without Hetzner's error body: a gateway or proxy
		// on the way, not the API's verdict.
		return "", providers.ErrTransient
	case errors.As(err, &dns) && dns.IsNotFound:
		return "the API endpoint's host does not exist (is the endpoint right?)", providers.ErrPermanent
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "", providers.ErrTransient
	}
	return "", providers.ErrTransient
}

// codeOf is the Hetzner error code of err, "" for an error the API did
// not answer.
func codeOf(err error) hcloud.ErrorCode {
	var he hcloud.Error
	if errors.As(err, &he) {
		return he.Code
	}
	return ""
}

// checkVerdict turns the Checker's call into a verdict: stable CamelCase
// reasons, the cloud's words in the message, never the token.
func checkVerdict(err error) (ready bool, reason, message string) {
	if err == nil {
		return true, "OK", "listing servers works"
	}
	_, class := classOf(err)
	switch code := codeOf(err); {
	case errors.Is(err, errTokenFile):
		return false, "CredentialsUnreadable", err.Error()
	case code == hcloud.ErrorCodeUnauthorized:
		return false, "Unauthorized", err.Error()
	case code == hcloud.ErrorCodeForbidden:
		return false, "Forbidden", err.Error()
	case code == hcloud.ErrorCodeRateLimitExceeded:
		return false, "Throttled", err.Error()
	case code != "" && class == providers.ErrTransient:
		return false, "Unavailable", err.Error()
	case code != "":
		return false, "Error", err.Error()
	case errors.Is(err, hcloud.ErrStatusCode):
		return false, "Unavailable", err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return false, "Timeout", err.Error()
	}
	return false, "Unreachable", err.Error()
}
