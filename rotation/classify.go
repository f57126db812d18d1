package rotation

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Classifier maps a site's HTTP status to a rotation Result. The lists are
// configurable because sites signal blocks differently (some answer 503).
type Classifier struct {
	// RateLimit statuses cool {member, target} down honouring Retry-After.
	RateLimit []int
	// Ban statuses cool {member, target} down for the default window.
	Ban []int
	// Rules are read before the status lists: the first matching rule
	// decides, so a rule can also read a listed status differently (a 403
	// without a challenge marker stays a ban through Ban).
	Rules BanRules
}

// DefaultClassifier treats 429 as rate limiting and 403 as a ban.
func DefaultClassifier() Classifier {
	return Classifier{RateLimit: []int{http.StatusTooManyRequests}, Ban: []int{http.StatusForbidden}}
}

// Classify reads one response status. A status on both lists is rate
// limiting (the more specific signal, which honours Retry-After); any status
// on neither list is ResultOK.
func (c Classifier) Classify(status int) Result {
	for _, s := range c.RateLimit {
		if s == status {
			return ResultRateLimited
		}
	}
	for _, s := range c.Ban {
		if s == status {
			return ResultBanned
		}
	}
	return ResultOK
}

// ClassifyAnswer reads a whole answer: the first ban rule that matches,
// else the status lists (Classify).
func (c Classifier) ClassifyAnswer(a Answer) Result {
	if res, ok := c.Rules.Classify(a); ok {
		return res
	}
	return c.Classify(a.Status)
}

// NeedsBody reports whether ClassifyAnswer needs the body of an answer
// with this head (see BanRules.NeedsBody).
func (c Classifier) NeedsBody(status int, h http.Header) bool {
	return len(c.Rules) > 0 && c.Rules.NeedsBody(status, h)
}

// ParseStatusList parses a comma-separated list of HTTP statuses such as
// "429,503" (flag and env values). Blanks around items are ignored and
// duplicates dropped; an empty or all-blank string is an empty list, which
// turns that signal off. Every item must be an integer in 100..599.
func ParseStatusList(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return []int{}, nil
	}
	items := strings.Split(s, ",")
	out := make([]int, 0, len(items))
	seen := make(map[int]bool, len(items))
	for i, raw := range items {
		item := strings.TrimSpace(raw)
		if item == "" {
			return nil, fmt.Errorf("status list %q: item %d is empty", s, i+1)
		}
		n, err := strconv.Atoi(item)
		if err != nil {
			return nil, fmt.Errorf("status list %q: item %d (%q) is not a number", s, i+1, item)
		}
		if n < 100 || n > 599 {
			return nil, fmt.Errorf("status list %q: item %d (%d) is not an HTTP status (100..599)", s, i+1, n)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

// minRetryAfter is the shortest rest a site's Retry-After asks for: "0"
// and a date at or before now read as this. The site did answer with a
// rate limit, so the member rests (a zero would read as "no Retry-After"
// downstream, pool.Report's zero value, and give the 10-minute default
// the site asked not to have); a second is what "retry now" means for a
// crawler that would otherwise hammer it.
const minRetryAfter = time.Second

// ParseRetryAfter reads a Retry-After header value: delta-seconds ("120") or
// an HTTP-date in any of the three forms http.ParseTime accepts.
//
// It returns ok=false for anything else (empty, negative, fractional,
// garbage), so the caller falls back to its default window. A date at or
// before now, and "0", are valid and return (minRetryAfter, true): the
// site asked for no wait, which is a short rest, not the default window.
// Absurdly large values saturate rather than overflow; the cooldown policy
// caps them.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil || secs > uint64(math.MaxInt64/int64(time.Second)) {
			// Only a range error is possible for an all-digit string.
			return time.Duration(math.MaxInt64), true
		}
		return max(time.Duration(secs)*time.Second, minRetryAfter), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), minRetryAfter), true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// CooldownPolicy says how long a {member, target} pair rests after a ban.
type CooldownPolicy struct {
	// Default is the window when the site gave no Retry-After.
	Default time.Duration
	// Max caps every window, backoff included; zero or negative means no cap.
	Max time.Duration
}

// Window is the cooldown after the strikes-th consecutive ban: the base
// (retryAfter when positive, else Default) for the first strike, doubled for
// each further strike, capped at Max. It never overflows; strikes below 1
// count as 1.
func (p CooldownPolicy) Window(retryAfter time.Duration, strikes int) time.Duration {
	base := p.Default
	if retryAfter > 0 {
		base = retryAfter
	}
	if base <= 0 {
		return 0
	}
	limit := time.Duration(math.MaxInt64)
	if p.Max > 0 {
		limit = p.Max
	}
	w := base
	for i := 1; i < strikes && w < limit; i++ {
		if w > limit/2 {
			w = limit
			break
		}
		w *= 2
	}
	return min(w, limit)
}
