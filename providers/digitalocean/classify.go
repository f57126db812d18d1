package digitalocean

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"

	"github.com/digitalocean/godo"

	"github.com/proxyfleet/proxyfleet/providers"
)

// classify wraps a DigitalOcean call's error with its taxonomy class,
// keeping the cloud's status and message in the text (they end in the
// Proxy's condition):
//
//   - 422 saying the droplet limit would be exceeded, and 422 saying a
//     size or region cannot take droplets now → ErrQuotaExceeded;
//   - 404 → ErrNotFound (callers decide what absence means for them);
//   - 429 (the API's rate limit), any 5xx, network and context errors →
//     ErrTransient;
//   - 401 (a token DigitalOcean does not know), 403 (a token without the
//     scope), and every other 4xx, such as 422 for an unknown image, size
//     or region → ErrPermanent: the same request fails the same way until
//     a human changes the token or the spec;
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

// classOf is classify's verdict and, where the cloud's words need one, a
// hint for the human reading the condition.
func classOf(err error) (hint string, class error) {
	var re *godo.ErrorResponse
	var dns *net.DNSError
	switch {
	case errors.Is(err, errTokenFile):
		if errors.Is(err, fs.ErrNotExist) {
			return "the token Secret is not mounted (yet)", providers.ErrTransient
		}
		return "", providers.ErrPermanent
	case errors.As(err, &re) && re.Response != nil:
		switch code := re.Response.StatusCode; {
		case code == http.StatusUnprocessableEntity && quotaMessage(re.Message):
			return "", providers.ErrQuotaExceeded
		case code == http.StatusNotFound:
			return "", providers.ErrNotFound
		case code == http.StatusTooManyRequests || code >= 500:
			return "", providers.ErrTransient
		case code == http.StatusUnauthorized:
			return "the API token was refused", providers.ErrPermanent
		case code == http.StatusForbidden:
			return "the API token may not do this (its scopes)", providers.ErrPermanent
		}
		return "", providers.ErrPermanent
	case errors.As(err, &dns) && dns.IsNotFound:
		return "the API endpoint's host does not exist (is the endpoint right?)", providers.ErrPermanent
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "", providers.ErrTransient
	}
	return "", providers.ErrTransient
}

// quotaMessage reports a 422 that means "full for now": the account's
// droplet limit ("creating this/these droplet(s) will exceed your droplet
// limit"), or a size or region that cannot take droplets at the moment.
// DigitalOcean answers these with the same status and id as a bad
// request, so the words decide.
func quotaMessage(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "droplet limit") || strings.Contains(m, "exceed your") ||
		strings.Contains(m, "not available in this region") || strings.Contains(m, "temporarily unavailable")
}

// statusOf is the HTTP status of a DigitalOcean answer, 0 for an error the
// API did not answer.
func statusOf(err error) int {
	var re *godo.ErrorResponse
	if errors.As(err, &re) && re.Response != nil {
		return re.Response.StatusCode
	}
	return 0
}

// checkVerdict turns the Checker's call into a verdict: stable CamelCase
// reasons, the cloud's words in the message, never the token.
func checkVerdict(err error) (ready bool, reason, message string) {
	if err == nil {
		return true, "OK", "listing droplets works"
	}
	switch code := statusOf(err); {
	case errors.Is(err, errTokenFile):
		return false, "CredentialsUnreadable", err.Error()
	case code == http.StatusUnauthorized:
		return false, "Unauthorized", err.Error()
	case code == http.StatusForbidden:
		return false, "Forbidden", "the token may not read droplets (droplet:read): " + err.Error()
	case code == http.StatusTooManyRequests:
		return false, "Throttled", err.Error()
	case code >= 500:
		return false, "Unavailable", err.Error()
	case code != 0:
		return false, "Error", err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return false, "Timeout", err.Error()
	}
	return false, "Unreachable", err.Error()
}
