package admission

import (
	"net/netip"
	"strings"
	"testing"
)

func TestTokenSetFindsWhichClientsTokenMatched(t *testing.T) {
	s := newTokenSet([]string{"alpha", "beta-long-token"})
	for _, tc := range []struct {
		tok  string
		want int
	}{{"alpha", 0}, {"beta-long-token", 1}, {"alph", -1}, {"alphaa", -1}, {"", -1}} {
		if got := s.match(tc.tok); got != tc.want {
			t.Errorf("match(%q) = %v, want %v", tc.tok, got, tc.want)
		}
	}
	if newTokenSet(nil).match("") != -1 {
		t.Error("an empty token set matches the empty token")
	}
}

func TestForbiddenReason(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"127.0.0.1", "loopback"}, {"::1", "loopback"}, {"10.0.0.1", "private"}, {"172.16.5.4", "private"},
		{"192.168.1.1", "private"}, {"100.64.0.1", "private"}, {"100.127.255.255", "private"}, {"fd12::1", "private"},
		{"169.254.169.254", "link-local"}, {"fe80::1", "link-local"}, {"0.0.0.0", "unspecified"}, {"::", "unspecified"},
		{"0.1.2.3", "unspecified"}, {"239.1.2.3", "multicast"}, {"224.0.0.1", "link-local"}, {"ff02::1", "link-local"}, {"ff05::1", "multicast"},
		{"255.255.255.255", "reserved"}, {"::ffff:10.0.0.1", "private"}, {"64:ff9b::a00:1", "private"},
		{"192.0.2.1", ""}, {"8.8.8.8", ""}, {"2001:db8::1", ""}, {"100.128.0.1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got := forbiddenReason(mustAddr(t, tt.addr))
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("forbiddenReason(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
