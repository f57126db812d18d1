package rotation

import (
	"strings"
	"testing"
)

func TestTargetKey(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"host is lower-cased", "Example.COM", "example.com"},
		{"port is dropped", "example.com:443", "example.com"},
		{"trailing dot is dropped", "example.com.", "example.com"},
		{"trailing dot and port are dropped", "Example.com.:8080", "example.com"},
		{"ipv4 with port", "192.0.2.1:80", "192.0.2.1"},
		{"ipv6 brackets and port dropped", "[2001:DB8::1]:443", "2001:db8::1"},
		{"bracketed ipv6 without port", "[::1]", "::1"},
		{"bare ipv6", "2001:db8:0:0:0:0:0:1", "2001:db8::1"},
		{"ipv6 is canonicalised", "[0:0::1]:80", "::1"},
		{"empty port is dropped", "example.com:", "example.com"},
		{"empty stays empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := TargetKey(tc.in); got != tc.want {
				t.Errorf("TargetKey(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		name, in, want, err string
	}{
		{"a host is its key", "Example.COM", "example.com", ""},
		{"host:port", "example.com:443", "example.com", ""},
		{"an underscore is a name's", "_dmarc.example.com", "_dmarc.example.com", ""},
		{"ipv4", "192.0.2.1:80", "192.0.2.1", ""},
		{"bracketed ipv6 with port", "[2001:DB8::1]:443", "2001:db8::1", ""},
		{"bracketed ipv6", "[::1]", "::1", ""},
		{"bare ipv6", "2001:db8::1", "2001:db8::1", ""},
		{"a URL is not a target", "https://EXAMPLE.com/x", "", "is a URL"},
		{"a path is not a target", "example.com/x", "", `'/'`},
		{"a login is not a target", "u@example.com", "", `'@'`},
		{"a space", "bad host", "", `' '`},
		{"a query", "example.com?x", "", `'?'`},
		{"empty", "", "", "empty host"},
		{"empty host with a port", ":443", "", "empty host"},
		{"a port out of range", "example.com:65536", "", "not 1 to 65535"},
		{"port zero", "example.com:0", "", "not 1 to 65535"},
		{"an empty port", "example.com:", "", "not 1 to 65535"},
		{"a port that is not a number", "example.com:https", "", "not 1 to 65535"},
		{"an open bracket", "[::1", "", "not host:port"},
		{"colons that are no address", "a:b:c", "", "neither a name nor an IP address"},
		{"a character no name has", "exa!mple.com", "", `has '!'`},
		{"a dot alone", ".", "", "empty label"},
		{"an empty label", "a..b", "", "empty label"},
		{"a trailing dot is a name's", "example.com.", "example.com", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTarget(tc.in)
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseTarget(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("ParseTarget(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
		})
	}
}

// FuzzParseTarget: any input is a key or an error, never a panic; a key
// is what TargetKey makes of the same input, and is itself a target.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"example.com", "example.com:443", "[::1]:80", "::1", "https://x/y", "a b", "[::1", "x:0", "_a.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := ParseTarget(s)
		if err != nil {
			return
		}
		if key != TargetKey(s) {
			t.Fatalf("ParseTarget(%q) = %q, TargetKey says %q", s, key, TargetKey(s))
		}
		if again, err := ParseTarget(key); err != nil || again != key {
			t.Fatalf("the key %q of %q does not parse as itself: %q %v", key, s, again, err)
		}
	})
}
