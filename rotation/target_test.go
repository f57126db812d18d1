package rotation

import "testing"

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
