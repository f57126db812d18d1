// Package rotation is the gateway's pure policy: which upstream to pick, how to
// read an answer as a ban signal, how long a cooldown lasts. It does no I/O;
// the gateway and pool packages act on what it decides.
package rotation

import "fmt"

// Result is what one use of an upstream for one target told us. The strings
// are the lease API's wire values ("result" in a report).
type Result string

const (
	// ResultOK resets the ban backoff of {member, target}.
	ResultOK Result = "ok"
	// ResultRateLimited (429 by default) cools {member, target} down, for Retry-After when given.
	ResultRateLimited Result = "rate_limited"
	// ResultBanned (403 by default) cools {member, target} down for the default window.
	ResultBanned Result = "banned"
	// ResultUpstreamFailed means the upstream itself failed (refused, timed out,
	// answered CONNECT with non-2xx): the member is out for every target for a
	// short window.
	ResultUpstreamFailed Result = "upstream_failed"
)

// ParseResult validates a wire value.
func ParseResult(s string) (Result, error) {
	switch r := Result(s); r {
	case ResultOK, ResultRateLimited, ResultBanned, ResultUpstreamFailed:
		return r, nil
	}
	return "", fmt.Errorf("invalid result %q: want one of ok, rate_limited, banned, upstream_failed", s)
}

// IsBan reports whether r cools a {member, target} pair down.
func (r Result) IsBan() bool { return r == ResultRateLimited || r == ResultBanned }
