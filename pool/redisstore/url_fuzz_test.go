package redisstore

import (
	"strings"
	"testing"
)

// FuzzParseRedisURL: whatever a lease store URL around a password looks
// like, an error never shows the password (the flag's value is logged and
// printed), and a URL that reads keeps it for AUTH.
func FuzzParseRedisURL(f *testing.F) {
	for _, s := range [][3]string{
		{"redis", "user", "127.0.0.1:6379/0"},
		{"rediss", "", "h:6380"},
		{"redis+sentinel", "u", "a:1,b:2/mymaster/1"},
		{"redis+cluster", "", "a:1,b:2,c:3"},
		{"redis", "u", "h:99999"},
		{"redis", "u", "h/x@y"},
		{"redis", "u", "h:1?db=2"},
		{"http", "u", "h:1"},
		{"redis", "u:x", "[::1]:6379"},
		{"redis", "", "h:1/%zz"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	const secret = "Pw7secretQ"
	f.Fuzz(func(t *testing.T, scheme, user, rest string) {
		if strings.Contains(scheme+user+rest, secret) || strings.Contains(secret, scheme+user+rest) {
			return
		}
		raw := scheme + "://" + user + ":" + secret + "@" + rest
		o, err := ParseRedisURL(raw)
		if err != nil {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("%q: the error shows the password: %v", raw, err)
			}
			return
		}
		if o.Password != secret && !strings.Contains(rest, "@") && !strings.ContainsAny(user, ":@/?#") {
			t.Fatalf("%q: read with password %q, want %q", raw, o.Password, secret)
		}
	})
}
