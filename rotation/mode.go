package rotation

import (
	"fmt"
	"strings"
)

// Mode is how long a (session, target) pair keeps its upstream.
type Mode string

const (
	// ModeSticky keeps one upstream per (session, target) for the lease TTL,
	// leaving it early on a ban or failure.
	ModeSticky Mode = "sticky"
	// ModeRequest picks an upstream for every request.
	ModeRequest Mode = "request"
)

// ParseMode reads a --rotation flag or rotate= username value: "sticky",
// "request" or "per-request" (an alias of "request"), case-insensitive.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "sticky":
		return ModeSticky, nil
	case "request", "per-request":
		return ModeRequest, nil
	}
	return "", fmt.Errorf("invalid rotation mode %q: want sticky, request or per-request", s)
}

// Retryable reports whether a request may be replayed on another upstream
// after a ban answer or an upstream failure: safe methods (GET, HEAD,
// OPTIONS, TRACE) without a body. Methods are case-sensitive (RFC 9110).
func Retryable(method string, hasBody bool) bool {
	if hasBody {
		return false
	}
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}
