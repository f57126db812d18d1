// Package redact is the one policy for showing a URL that may carry a
// secret (an upstream proxy's login, a Redis password, a token in a probe
// URL) in an error, a log record, a listing or a status condition. Every
// place that prints such a URL goes through URL (text as the user wrote it,
// parsable or not) or Parsed (a URL already parsed); no package keeps a
// redaction of its own.
//
// The policy:
//   - A password is replaced by [Mask]; the user name before it stays, as
//     url.URL.Redacted keeps it (it names the account, and a 407 is
//     diagnosed by it).
//   - A user name without a password, or with an empty one, is the
//     credential itself (a token as user name, https://TOKEN@host; curl's
//     -u TOKEN: convention, https://TOKEN:@host; a proxy's API key as its
//     user) and is masked whole: xxxxx@ and xxxxx:@. This is stricter than
//     url.URL.Redacted.
//   - The value of a query or fragment parameter whose name contains pass,
//     pwd, secret, token, key, auth, sig, cred or session (any case) is
//     masked: ?access_token=, ?X-Amz-Signature=, ?password=.
//   - Text is never trusted to be well formed: URL does not parse. After
//     the scheme, everything up to the last '@' is userinfo, so a password
//     holding '@', '/', '?', '#' or spaces, a list of hosts
//     (redis+sentinel://:pw@h1:1,h2:2/master) and a string url.Parse refuses
//     are all masked the same way. Without a scheme, everything before the
//     last '@' is masked. A string without '@' has no userinfo, but a
//     login whose host was left out (http://user:secret) reads as a host
//     with a port, so a port that is not a number is masked as a password
//     would be; the rest is shown with only its secret parameters masked.
//
// The price of never guessing is over-masking: an '@' in a path or query
// (https://h/?email=a@b) hides everything before it. Parsed has no such
// doubt, since the parser has already decided what the userinfo is.
//
// It imports only the standard library and must stay so: every layer
// (pool, gateway, controller, cmd, the sidecar build) uses it.
package redact

import (
	"errors"
	"net/url"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// URL returns raw fit to show: its password, a lone user name and its
// secret parameters masked (see the package doc). raw need not parse.
func URL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !validScheme(scheme) {
		if at := strings.LastIndexByte(raw, '@'); at >= 0 {
			return Mask + "@" + params(raw[at+1:])
		}
		return params(ports(raw))
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return scheme + "://" + userinfo(rest[:at]) + "@" + params(rest[at+1:])
	}
	return scheme + "://" + params(ports(rest))
}

// ports masks every port of s's authority (up to its first '/', '?' or
// '#'; a comma-separated host list too) that is not a number: in a string
// without '@' that is where a password stands whose host was left out.
func ports(s string) string {
	end := strings.IndexAny(s, "/?#")
	if end < 0 {
		end = len(s)
	}
	hosts := strings.Split(s[:end], ",")
	changed := false
	for i, h := range hosts {
		if p := portAt(h); p >= 0 && !digits(h[p+1:]) {
			hosts[i], changed = h[:p+1]+Mask, true
		}
	}
	if !changed {
		return s
	}
	return strings.Join(hosts, ",") + s[end:]
}

// portAt is the index of the ':' before h's port, -1 when it has none (an
// IPv6 literal's colons are in its brackets).
func portAt(h string) int {
	from := 0
	if strings.HasPrefix(h, "[") {
		if from = strings.IndexByte(h, ']'); from < 0 {
			return -1
		}
	}
	if c := strings.LastIndexByte(h[from:], ':'); c >= 0 {
		return from + c
	}
	return -1
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Parsed is URL for a parsed URL: the same policy, on the parser's reading
// of the userinfo and query; "" for nil.
func Parsed(u *url.URL) string {
	if u == nil {
		return ""
	}
	if u.Opaque != "" { // scheme:user:pw@host: no authority the parser saw
		return URL(u.String())
	}
	c := *u
	if c.User != nil {
		switch pw, ok := c.User.Password(); {
		case ok && pw != "":
			c.User = url.UserPassword(c.User.Username(), Mask)
		case c.User.Username() == "": // "@" or ":@": nothing secret
		case ok:
			c.User = url.UserPassword(Mask, "")
		default:
			c.User = url.User(Mask)
		}
	}
	c.RawQuery = maskPairs(c.RawQuery)
	if f := maskPairs(c.Fragment); f != c.Fragment {
		c.Fragment, c.RawFragment = f, ""
	}
	return c.String()
}

// Reason says why url.Parse refused raw without quoting a secret: the
// parser's own reason (an invalid port, escape or host character) when raw
// has no '@' and so no userinfo the reason could quote part of, and no
// port that is not a number (a password whose host was left out: the
// parser would quote it); else "malformed URL". url.Parse's error itself
// holds raw whole and must not be shown.
func Reason(raw string, err error) string {
	var ue *url.Error
	if errors.As(err, &ue) && !strings.Contains(raw, "@") {
		rest := raw
		if _, r, ok := strings.Cut(raw, "://"); ok {
			rest = r
		}
		if ports(rest) != rest {
			return "malformed URL: a port that is not a number (a login is user:password@host:port)"
		}
		return ue.Err.Error()
	}
	return "malformed URL"
}

// userinfo masks the password of ui (everything after its first ':'), or
// all of a lone user name or of one before an empty password.
func userinfo(ui string) string {
	if c := strings.IndexByte(ui, ':'); c >= 0 {
		if c == len(ui)-1 { // nothing after the ':'
			if c == 0 {
				return ":"
			}
			return Mask + ":"
		}
		return ui[:c] + ":" + Mask
	}
	if ui == "" {
		return ""
	}
	return Mask
}

// params masks the secret parameters of the query and fragment of s, the
// part of a URL after its userinfo.
func params(s string) string {
	i := strings.IndexAny(s, "?#")
	if i < 0 {
		return s
	}
	return s[:i+1] + maskPairs(s[i+1:])
}

// maskPairs masks the value of every name=value pair in s whose name looks
// secret. Pairs are split at '&', ';', '?' and '#', more often than a
// parser would: splitting too often only masks more.
func maskPairs(s string) string {
	if !strings.Contains(s, "=") {
		return s
	}
	var b strings.Builder
	for s != "" {
		end := strings.IndexAny(s, "&;?#")
		if end < 0 {
			end = len(s)
		}
		pair := s[:end]
		if name, _, ok := strings.Cut(pair, "="); ok && secretName(name) {
			pair = name + "=" + Mask
		}
		b.WriteString(pair)
		if end < len(s) {
			b.WriteByte(s[end])
			end++
		}
		s = s[end:]
	}
	return b.String()
}

// secretWords are the parts of a parameter name that mark its value secret.
var secretWords = []string{"pass", "pwd", "secret", "token", "key", "auth", "sig", "cred", "session"}

func secretName(name string) bool {
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.'), so that text before a "://" later in
// the string is not taken for one.
func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case i > 0 && ('0' <= r && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return true
}
