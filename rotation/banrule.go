package rotation

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// DefaultBanBodyBytes is how much of an answer's body ban rules search by
// default (the --ban-body-bytes flag's default): challenge pages put their
// markers near the top, and reading ahead more only delays the answer.
const DefaultBanBodyBytes = 64 << 10

// maxBanRuleLen bounds one rule's text, so a config cannot hand the parser
// (and the regexp compiler) unbounded work.
const maxBanRuleLen = 4096

// BanRule is one ban signal beyond a bare status: fields that must all
// match an answer, and what the answer means when they do. Sites answer
// bans with a 200 and a challenge page, so a status list alone misses them.
//
// The text form is space-separated fields (see ParseBanRule):
//
//	status=403,503 header:cf-mitigated~^challenge$ action=banned
//	status=200 body~(?i)captcha action=banned
type BanRule struct {
	// Text is the rule as written (after preset expansion), for messages.
	Text string
	// Statuses the answer's status must be one of; empty means any status.
	Statuses []int
	// Headers each must match one value of the named header.
	Headers []HeaderMatch
	// Body, when set, must match within the first bytes of the body the
	// gateway reads ahead (--ban-body-bytes).
	Body *regexp.Regexp
	// Action is ResultRateLimited or ResultBanned.
	Action Result
}

// HeaderMatch is a `header:NAME~REGEX` field.
type HeaderMatch struct {
	// Name is canonical (http.CanonicalHeaderKey).
	Name string
	Re   *regexp.Regexp
}

// Answer is the part of a site's answer ban rules read.
type Answer struct {
	Status int
	Header http.Header
	// Body is the read-ahead prefix of the body (decoded when it was
	// gzip- or deflate-encoded); only meaningful when BodyRead.
	Body []byte
	// BodyRead says the body was read ahead. An answer without a body
	// (HEAD, 204, 304) or whose body was not needed has BodyRead false, and
	// a rule with a body field never matches it.
	BodyRead bool
}

// banPresets are the named rules, opt-in with `preset=NAME`. Each is
// documented in README.md with what it matches.
var banPresets = map[string][]string{
	// Cloudflare's managed challenge and JS challenge: 403 or 503 with
	// cf-mitigated: challenge (Cloudflare's documented marker).
	"cloudflare-challenge": {`status=403,503 header:cf-mitigated~(?i)^challenge$ action=banned`},
	// A 200 page that embeds one of the common captcha widgets (reCAPTCHA,
	// hCaptcha, Cloudflare Turnstile, DataDome's captcha-delivery).
	"captcha": {`status=200 body~(?i)(g-recaptcha|recaptcha/api\.js|h-captcha|hcaptcha\.com/1/api\.js|cf-turnstile|challenges\.cloudflare\.com/turnstile|captcha-delivery\.com) action=banned`},
	// A 200 whose body is empty: some sites answer blocked clients so.
	"empty-200": {`status=200 body~^$ action=banned`},
}

// BanPresets lists the preset names, sorted, for messages and docs.
func BanPresets() []string {
	names := make([]string, 0, len(banPresets))
	for n := range banPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ParseBanRule parses one rule, or `preset=NAME`, which expands to the
// preset's rules. Fields are separated by blanks (a regular expression
// cannot contain a blank: write \s or \x20); every field may appear once:
//
//   - status=LIST: comma-separated statuses (as ParseStatusList, not empty)
//   - header:NAME~REGEX: a value of header NAME matches REGEX (repeatable,
//     one field per header)
//   - body~REGEX: REGEX matches within the read-ahead body
//   - action=rate_limited|banned: required
//
// A rule must have at least one of status, header or body besides action.
// Errors quote the rule and say which field is wrong.
func ParseBanRule(s string) ([]BanRule, error) {
	if len(s) > maxBanRuleLen {
		return nil, fmt.Errorf("ban rule longer than %d bytes", maxBanRuleLen)
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("ban rule %q is empty", s)
	}
	if name, ok := strings.CutPrefix(fields[0], "preset="); ok {
		if len(fields) > 1 {
			return nil, fmt.Errorf("ban rule %q: a preset stands alone (got more fields after preset=%s)", s, name)
		}
		texts, ok := banPresets[name]
		if !ok {
			return nil, fmt.Errorf("ban rule %q: unknown preset %q (presets: %s)", s, name, strings.Join(BanPresets(), ", "))
		}
		out := make([]BanRule, 0, len(texts))
		for _, t := range texts {
			r, err := parseOneRule(t)
			if err != nil {
				panic("rotation: ban preset " + name + ": " + err.Error()) // a typo above, caught by every test
			}
			out = append(out, r)
		}
		return out, nil
	}
	r, err := parseOneRule(s)
	if err != nil {
		return nil, err
	}
	return []BanRule{r}, nil
}

func parseOneRule(s string) (BanRule, error) {
	r := BanRule{Text: strings.Join(strings.Fields(s), " ")}
	seenHeader := map[string]bool{}
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("ban rule %q: field %q: %s", r.Text, field, fmt.Sprintf(format, a...))
	}
	for _, f := range strings.Fields(s) {
		switch {
		case strings.HasPrefix(f, "status="):
			if r.Statuses != nil {
				return BanRule{}, bad(f, "status given twice")
			}
			list, err := ParseStatusList(strings.TrimPrefix(f, "status="))
			if err != nil {
				return BanRule{}, bad(f, "%v", err)
			}
			if len(list) == 0 {
				return BanRule{}, bad(f, "empty status list")
			}
			r.Statuses = list
		case strings.HasPrefix(f, "header:"):
			name, expr, ok := strings.Cut(strings.TrimPrefix(f, "header:"), "~")
			if !ok {
				return BanRule{}, bad(f, "want header:NAME~REGEX")
			}
			if !validHeaderName(name) {
				return BanRule{}, bad(f, "%q is not a header name", name)
			}
			name = http.CanonicalHeaderKey(name)
			if seenHeader[name] {
				return BanRule{}, bad(f, "header %s given twice", name)
			}
			seenHeader[name] = true
			re, err := compileRuleRegexp(expr)
			if err != nil {
				return BanRule{}, bad(f, "%v", err)
			}
			r.Headers = append(r.Headers, HeaderMatch{Name: name, Re: re})
		case strings.HasPrefix(f, "body~"):
			if r.Body != nil {
				return BanRule{}, bad(f, "body given twice")
			}
			re, err := compileRuleRegexp(strings.TrimPrefix(f, "body~"))
			if err != nil {
				return BanRule{}, bad(f, "%v", err)
			}
			r.Body = re
		case strings.HasPrefix(f, "action="):
			if r.Action != "" {
				return BanRule{}, bad(f, "action given twice")
			}
			switch a := Result(strings.TrimPrefix(f, "action=")); a {
			case ResultRateLimited, ResultBanned:
				r.Action = a
			default:
				return BanRule{}, bad(f, "want action=rate_limited or action=banned")
			}
		default:
			return BanRule{}, bad(f, "unknown field (want status=LIST, header:NAME~REGEX, body~REGEX, action=rate_limited|banned, or preset=NAME alone)")
		}
	}
	if r.Action == "" {
		return BanRule{}, fmt.Errorf("ban rule %q: no action= (want action=rate_limited or action=banned)", r.Text)
	}
	if r.Statuses == nil && r.Headers == nil && r.Body == nil {
		return BanRule{}, fmt.Errorf("ban rule %q: matches every answer (give status=, header: or body~)", r.Text)
	}
	return r, nil
}

func compileRuleRegexp(expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, fmt.Errorf("empty regular expression")
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("bad regular expression: %v", err)
	}
	return re, nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// matchHead reports whether the status and headers match (the body is not
// looked at).
func (r *BanRule) matchHead(status int, h http.Header) bool {
	if r.Statuses != nil && !slices.Contains(r.Statuses, status) {
		return false
	}
	for _, hm := range r.Headers {
		ok := false
		for _, v := range h[hm.Name] {
			if hm.Re.MatchString(v) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Match reports whether a matches every field of r.
func (r *BanRule) Match(a Answer) bool {
	if !r.matchHead(a.Status, a.Header) {
		return false
	}
	if r.Body != nil {
		return a.BodyRead && r.Body.Match(a.Body)
	}
	return true
}

// BanRules is an ordered list of rules: the first that matches decides.
type BanRules []BanRule

// ParseBanRules parses each text with ParseBanRule, in order.
func ParseBanRules(texts []string) (BanRules, error) {
	var out BanRules
	for _, t := range texts {
		rs, err := ParseBanRule(t)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// NeedsBody reports whether deciding about an answer with this status and
// these headers needs its body: some rule that has a body field matches the
// head, and no earlier rule without one already decides. The gateway reads
// a body ahead only then, so a crawl without body rules streams as before.
func (rs BanRules) NeedsBody(status int, h http.Header) bool {
	for i := range rs {
		r := &rs[i]
		if !r.matchHead(status, h) {
			continue
		}
		if r.Body == nil {
			return false // this rule decides on the head alone
		}
		return true
	}
	return false
}

// Classify returns the action of the first rule that matches a, and false
// when none does.
func (rs BanRules) Classify(a Answer) (Result, bool) {
	for i := range rs {
		if rs[i].Match(a) {
			return rs[i].Action, true
		}
	}
	return "", false
}
