package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/api/googleapi"

	"github.com/proxyfleet/proxyfleet/providers"
)

// quotaReasons are the googleapi error reasons (and, for the zone capacity
// case, the code Compute Engine puts in the message) that mean "full for
// now": the reconciler waits and retries instead of failing the Proxy.
var quotaReasons = []string{"quotaExceeded", "rateLimitExceeded", "userRateLimitExceeded", "ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED"}

// classify wraps a Compute API error with its taxonomy class:
//
//   - 429, or a quota reason on any status → ErrQuotaExceeded;
//   - 404 → ErrNotFound (callers decide what absence means for them);
//   - 400, 403 and other 4xx → ErrPermanent: the same request fails the
//     same way until a human changes the spec, the IAM policy or the project;
//   - 5xx, network errors and context errors → ErrTransient.
//
// 401 is Transient: an expired access token is refreshed by the next call.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var class error
	var ge *googleapi.Error
	switch {
	case errors.As(err, &ge):
		switch {
		case ge.Code == http.StatusTooManyRequests || hasQuotaReason(ge):
			class = providers.ErrQuotaExceeded
		case ge.Code == http.StatusNotFound:
			class = providers.ErrNotFound
		case ge.Code == http.StatusUnauthorized, ge.Code == http.StatusRequestTimeout, ge.Code >= 500:
			class = providers.ErrTransient
		case ge.Code >= 400:
			class = providers.ErrPermanent
		default:
			class = providers.ErrTransient
		}
	default:
		class = providers.ErrTransient
	}
	if op == "" {
		return fmt.Errorf("%w: %w", class, err)
	}
	return fmt.Errorf("%w: %s: %w", class, op, err)
}

func hasQuotaReason(ge *googleapi.Error) bool {
	for _, item := range ge.Errors {
		for _, r := range quotaReasons {
			if item.Reason == r || strings.Contains(item.Message, r) {
				return true
			}
		}
	}
	for _, r := range quotaReasons {
		if strings.Contains(ge.Message, r) {
			return true
		}
	}
	return false
}

// isAlreadyExists reports a 409 answering an insert.
func isAlreadyExists(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusConflict
}

// checkVerdict turns the Checker's list call into a verdict. Reasons are
// stable CamelCase codes; messages carry the API's words, never credentials.
func checkVerdict(err error) (ready bool, reason, message string) {
	if err == nil {
		return true, "OK", "listing instances in the project works"
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		switch {
		case ge.Code == http.StatusTooManyRequests || hasQuotaReason(ge):
			return false, "QuotaExceeded", err.Error()
		case ge.Code == http.StatusUnauthorized:
			return false, "Unauthorized", err.Error()
		case ge.Code == http.StatusForbidden && hasReason(ge, "accessNotConfigured", "SERVICE_DISABLED"):
			return false, "APIDisabled", "the Compute Engine API is not enabled for the project: " + err.Error()
		case ge.Code == http.StatusForbidden:
			return false, "Forbidden", "the credentials may not list instances (compute.instances.list): " + err.Error()
		case ge.Code == http.StatusNotFound:
			return false, "ProjectNotFound", err.Error()
		case ge.Code >= 500:
			return false, "Unavailable", err.Error()
		}
		return false, "Error", err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return false, "Timeout", err.Error()
	}
	return false, "Unreachable", err.Error()
}

func hasReason(ge *googleapi.Error, reasons ...string) bool {
	for _, item := range ge.Errors {
		for _, r := range reasons {
			if item.Reason == r {
				return true
			}
		}
	}
	return strings.Contains(ge.Message, "has not been used in project") || strings.Contains(ge.Message, "it is disabled")
}
