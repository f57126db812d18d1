package gateway

import "testing"

func TestTokenSet(t *testing.T) {
	s := newTokenSet([]string{"alpha", "beta-long-token"})
	for _, tc := range []struct {
		tok  string
		want bool
	}{{"alpha", true}, {"beta-long-token", true}, {"alph", false}, {"alphaa", false}, {"", false}} {
		if got := s.match(tc.tok); got != tc.want {
			t.Errorf("match(%q) = %v, want %v", tc.tok, got, tc.want)
		}
	}
	if newTokenSet(nil).match("") {
		t.Error("an empty token set matches the empty token")
	}
}
