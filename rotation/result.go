// Package rotation is the gateway's pure policy: which upstream to pick, how to
// read an answer as a ban signal, how long a cooldown lasts. It does no I/O;
// the gateway and pool packages act on what it decides.
//
// It imports the standard library only: it is pure policy, and does no I/O.
package rotation

import "fmt"

// Result is what one use of an upstream for one target told us. The strings
// are the lease API's wire values ("result" in a report).
type Result string

const (
	// ResultOK resets the ban backoff of {member, target}; the member
	// answered, so a rest for its own failures ends too.
	ResultOK Result = "ok"
	// ResultRateLimited (429 by default) cools {member, target} down, for Retry-After when given.
	ResultRateLimited Result = "rate_limited"
	// ResultBanned (403 by default) cools {member, target} down for the default window.
	ResultBanned Result = "banned"
	// ResultUpstreamFailed means the upstream itself failed (refused, reset or
	// timed out, a failed TLS or SOCKS5 handshake, 407 to our credentials, or
	// MemberEvidence found it broken): the member is out for every target
	// for a short window.
	ResultUpstreamFailed Result = "upstream_failed"
	// ResultTargetUnreachable means the upstream answered that it cannot
	// reach the target (DNS, connect or access failure, 502/503/504): a
	// fact about the site, so only {member, target} rests, briefly, and
	// the member's ban backoff is left alone.
	ResultTargetUnreachable Result = "target_unreachable"
	// ResultAnswered means the member answered something (a request it
	// carried, a passing probe, a liveness check): a rest for its own
	// failures ends at once (see FailureRest). Bans and site rests stay,
	// and so do ban strikes. ResultOK ends a failure rest too.
	ResultAnswered Result = "answered"
)

// ParseResult validates a wire value.
func ParseResult(s string) (Result, error) {
	switch r := Result(s); r {
	case ResultOK, ResultRateLimited, ResultBanned, ResultUpstreamFailed, ResultTargetUnreachable, ResultAnswered:
		return r, nil
	}
	return "", fmt.Errorf("invalid result %q: want one of ok, rate_limited, banned, upstream_failed, target_unreachable, answered", s)
}

// IsBan reports whether r cools a {member, target} pair down.
func (r Result) IsBan() bool { return r == ResultRateLimited || r == ResultBanned }
