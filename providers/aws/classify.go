package aws

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/proxyfleet/proxyfleet/providers"
)

// quotaCodes are EC2 error codes that mean "full for now": the account's
// limits or the zone's capacity. The reconciler waits and retries instead
// of failing the Proxy.
var quotaCodes = map[string]bool{
	"InstanceLimitExceeded":              true,
	"VcpuLimitExceeded":                  true,
	"InsufficientInstanceCapacity":       true,
	"InsufficientCapacity":               true,
	"InsufficientAddressCapacity":        true,
	"InsufficientFreeAddressesInSubnet":  true,
	"AddressLimitExceeded":               true,
	"SecurityGroupLimitExceeded":         true,
	"RulesPerSecurityGroupLimitExceeded": true,
}

// transientCodes are EC2 error codes a later retry of the same call may
// pass: throttling (EC2 answers RequestLimitExceeded with 503) and its
// own failures.
var transientCodes = map[string]bool{
	"RequestLimitExceeded": true,
	"Throttling":           true,
	"ThrottlingException":  true,
	"RequestThrottled":     true,
	"InternalError":        true,
	"InternalFailure":      true,
	"ServiceUnavailable":   true,
	"Unavailable":          true,
	"RequestExpired":       true,
}

// notFoundCodes mean the instance asked for does not exist.
var notFoundCodes = map[string]bool{
	"InvalidInstanceID.NotFound": true,
}

// classify wraps an EC2 call's error with its taxonomy class, keeping the
// cloud's code and message in the text (they end in the Proxy's
// condition):
//
//   - quotaCodes → ErrQuotaExceeded;
//   - InvalidInstanceID.NotFound → ErrNotFound (callers decide what absence
//     means for them);
//   - transientCodes, any 5xx, network and context errors → ErrTransient;
//   - every other code EC2 answers (AuthFailure, UnauthorizedOperation,
//     InvalidAMIID.*, InvalidParameterValue for an unknown instance type,
//     OptInRequired for a region the account has not enabled, ...) →
//     ErrPermanent: the same request fails the same way until a human
//     changes the key, the IAM policy or the spec;
//   - an endpoint host that does not exist (the region's name is wrong) →
//     ErrPermanent.
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
	var ae smithy.APIError
	var re *awshttp.ResponseError
	var dns *net.DNSError
	switch {
	case errors.Is(err, errKeyFile):
		if errors.Is(err, fs.ErrNotExist) {
			return "the credentials Secret is not mounted (yet)", providers.ErrTransient
		}
		return "", providers.ErrPermanent
	case errors.As(err, &ae):
		code := ae.ErrorCode()
		switch {
		case quotaCodes[code]:
			return "", providers.ErrQuotaExceeded
		case notFoundCodes[code]:
			return "", providers.ErrNotFound
		case transientCodes[code]:
			return "", providers.ErrTransient
		case errors.As(err, &re) && re.HTTPStatusCode() >= 500:
			return "", providers.ErrTransient
		case code == "AuthFailure" || code == "UnauthorizedOperation" || strings.HasPrefix(code, "InvalidClientTokenId") || code == "SignatureDoesNotMatch":
			return "the credentials were refused or may not do this", providers.ErrPermanent
		}
		return "", providers.ErrPermanent
	case errors.As(err, &re) && re.HTTPStatusCode() >= 500:
		return "", providers.ErrTransient
	case errors.As(err, &dns) && dns.IsNotFound:
		return "the EC2 endpoint's host does not exist (is the region or endpoint right?)", providers.ErrPermanent
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "", providers.ErrTransient
	}
	return "", providers.ErrTransient
}

// errorCode is the EC2 error code of err, "" for an error EC2 did not answer.
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// checkVerdict turns the Checker's call into a verdict: stable CamelCase
// reasons, the cloud's words in the message, never a key.
func checkVerdict(err error) (ready bool, reason, message string) {
	if err == nil {
		return true, "OK", "listing instances in the region works"
	}
	_, class := classOf(err)
	code := errorCode(err)
	switch {
	case code == "AuthFailure" || code == "SignatureDoesNotMatch" || strings.HasPrefix(code, "InvalidClientTokenId"):
		return false, "Unauthorized", err.Error()
	case code == "UnauthorizedOperation":
		return false, "Forbidden", "the credentials may not describe instances (ec2:DescribeInstances): " + err.Error()
	case code == "OptInRequired":
		return false, "RegionNotEnabled", err.Error()
	case code == "RequestLimitExceeded" || class == providers.ErrQuotaExceeded:
		return false, "Throttled", err.Error()
	case errors.Is(err, errKeyFile):
		return false, "CredentialsUnreadable", err.Error()
	case code != "" && class == providers.ErrTransient:
		return false, "Unavailable", err.Error()
	case code != "":
		return false, "Error", err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return false, "Timeout", err.Error()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return false, "Unavailable", err.Error()
	}
	return false, "Unreachable", err.Error()
}
