package redact

import (
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty stays empty", "", ""},
		{"plain URL unchanged", "http://10.0.0.1:3128", "http://10.0.0.1:3128"},
		{"path kept", "https://example.org/healthz", "https://example.org/healthz"},
		{"password masked, user kept", "http://bob:hunter2@10.0.0.1:3128", "http://bob:xxxxx@10.0.0.1:3128"},
		{"user before an empty password is the credential", "http://sk_live_t0ken:@h:1", "http://xxxxx:@h:1"},
		{"empty user and password show nothing", "http://:@h:1", "http://:@h:1"},
		{"password without user", "redis://:hunter2@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"lone user name is the credential", "https://ghp_t0ken@github.com/x", "https://xxxxx@github.com/x"},
		{"empty userinfo shows nothing", "http://@h:1", "http://@h:1"},
		{"password holding @", "http://u:p@ss@h:1", "http://u:xxxxx@h:1"},
		{"password holding encoded @", "http://u:p%40ss@h:1", "http://u:xxxxx@h:1"},
		{"base64 password holding /", "redis://:ab/cd+e==@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"password holding ? and #", "http://u:a?b#c@h:1", "http://u:xxxxx@h:1"},
		{"unparsable: space in user, @ in password", "http://us er:p@ss@host", "http://us er:xxxxx@host"},
		{"unparsable: bad port with a login", "http://bob:hunter2@10.0.0.1:port", "http://bob:xxxxx@10.0.0.1:port"},
		{"a port that is not a number may be a password whose host was left out", "http://user:secretpw", "http://user:xxxxx"},
		{"the same in a host list", "redis+cluster://h1:1,h2:pw/0", "redis+cluster://h1:1,h2:xxxxx/0"},
		{"the same without a scheme", "user:secretpw", "user:xxxxx"},
		{"an IPv6 literal's colons are no port", "http://[::1]:3128/x", "http://[::1]:3128/x"},
		{"an IPv6 literal without a port", "http://[fe80::1]/x", "http://[fe80::1]/x"},
		{"bad escape shown as is", "%zz", "%zz"},
		{"no scheme: all before @ masked", "bob:hunter2@h:1", "xxxxx@h:1"},
		{"text before a later :// is no scheme", "u:pw@redis://h", "xxxxx@redis://h"},
		{"sentinel host list", "redis+sentinel://:pw@h1:26379,h2:26379/mymaster/0", "redis+sentinel://:xxxxx@h1:26379,h2:26379/mymaster/0"},
		{"cluster host list with user", "rediss+cluster://app:pw@h1:1,h2:2", "rediss+cluster://app:xxxxx@h1:1,h2:2"},
		{"host list without login unchanged", "redis+cluster://h1:1,h2:2", "redis+cluster://h1:1,h2:2"},
		{"secret query values masked", "https://h/p?a=1&token=abc&X-Amz-Signature=def", "https://h/p?a=1&token=xxxxx&X-Amz-Signature=xxxxx"},
		{"query names in any case, ; separated", "https://h/?Password=abc;api_key=k", "https://h/?Password=xxxxx;api_key=xxxxx"},
		{"encoded query name", "https://h/?pass%77ord=abc", "https://h/?pass%77ord=xxxxx"},
		{"fragment parameters masked", "https://h/#access_token=abc&x=1", "https://h/#access_token=xxxxx&x=1"},
		{"query name without value unchanged", "https://h/?token", "https://h/?token"},
		{"login and query secret", "https://u:pw@h/?sig=abc", "https://u:xxxxx@h/?sig=xxxxx"},
		{"no scheme with query secret", "h:1?secret=s", "h:1?secret=xxxxx"},
		{"@ in a query hides all before it", "https://h/?email=a@b.org", "https://xxxxx@b.org"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := URL(tc.in); got != tc.want {
				t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParsed(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"password masked, user kept", "http://bob:hunter2@10.0.0.1:3128", "http://bob:xxxxx@10.0.0.1:3128"},
		{"password without user", "redis://:pw@h:1", "redis://:xxxxx@h:1"},
		{"lone user name masked", "https://t0ken@h/", "https://xxxxx@h/"},
		{"user before an empty password masked", "https://t0ken:@h/", "https://xxxxx:@h/"},
		{"empty user and password show nothing", "https://:@h/", "https://:@h/"},
		{"plain URL unchanged", "https://example.org/healthz?x=1", "https://example.org/healthz?x=1"},
		{"@ in a path trusted to the parser", "https://h/users/@me", "https://h/users/@me"},
		{"secret query values masked", "https://h/?token=abc&a=1", "https://h/?token=xxxxx&a=1"},
		{"fragment parameters masked", "https://h/#access_token=abc", "https://h/#access_token=xxxxx"},
		{"opaque URL: all before @ masked", "u:pw@h", "xxxxx@h"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := Parsed(u); got != tc.want {
				t.Errorf("Parsed(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	if got := Parsed(nil); got != "" {
		t.Errorf("Parsed(nil) = %q, want empty", got)
	}
}

func TestReason(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"parser's reason without userinfo", "http://h:1/%zz", `invalid URL escape "%zz"`},
		{"no quote of a port that may be a password", "http://user:secretpw", "malformed URL: a port that is not a number (a login is user:password@host:port)"},
		{"no detail with userinfo (the reason could quote the password)", "http://u:hunter2@h:port", "malformed URL"},
		{"no detail for an @ anywhere", "http://u:a/hunter2@h", "malformed URL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := url.Parse(tc.in)
			if err == nil {
				t.Fatalf("url.Parse(%q) accepted it", tc.in)
			}
			if got := Reason(tc.in, err); got != tc.want {
				t.Errorf("Reason(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// marker stands for a password: it must never reach the output.
const marker = "Mk7qPw3zR"

// FuzzURL puts a password holding the marker, with any characters around it,
// between any text before and after (user name, scheme, host lists, queries,
// more '@'s): URL never shows the marker unless the policy reads it as a
// user name before a non-empty password (text before the fuzzed ':' can make
// that ':' part of a "://", so the marker lands in the user name), and
// Parsed never shows it when url.Parse reads it as part of the password or
// of a user name whose password is absent or empty. Nor does URL show a
// token parameter's value after any text.
func FuzzURL(f *testing.F) {
	f.Add("http://bob", "", "", "10.0.0.1:3128")
	f.Add("http://us er", "p@", "ss", "host")
	f.Add("redis+sentinel://", "ab/", "+e==", "h1:1,h2:2/master/0")
	f.Add("", "", "", "h:1")
	f.Add("https://u", "?#", "%40", "h/?token=x#y")
	f.Add("x://y://u", "://", ",", "h,http://v:w@h2")
	f.Add("A", "//", ":", "0")  // the fuzzed ':' forms the scheme's "://"; the marker is a user before an empty password
	f.Add("A", "//", ":x", "0") // ... and before a non-empty one: shown by policy
	f.Fuzz(func(t *testing.T, before, pwHead, pwTail, after string) {
		pw := pwHead + marker + pwTail
		raw := before + ":" + pw + "@" + after
		if strings.Count(raw, marker) != 1 {
			return // the marker written outside the password may be shown
		}
		if got := URL(raw); strings.Contains(got, marker) && !strings.Contains(shownUser(raw), marker) {
			t.Fatalf("URL(%q) = %q shows the password", raw, got)
		}
		if q := before + "?token=" + marker; !strings.Contains(before, marker) {
			if got := URL(q); strings.Contains(got, marker) {
				t.Fatalf("URL(%q) = %q shows the token", q, got)
			}
		}
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			return
		}
		p, ok := u.User.Password()
		if strings.Contains(p, marker) || (!ok || p == "") && strings.Contains(u.User.Username(), marker) {
			if got := Parsed(u); strings.Contains(got, marker) {
				t.Fatalf("Parsed(%q) = %q shows the password", raw, got)
			}
		}
	})
}

// shownUser is the user name the policy shows for raw: the text between a
// valid scheme's "://" and the first ':' of the userinfo (up to the last
// '@'), when a non-empty password follows that ':'; else "".
func shownUser(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !validScheme(scheme) {
		return ""
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	if user, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
		return user
	}
	return ""
}
