package ascii

import "testing"

func TestEqualFoldFoldsASCIIOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
		want bool
	}{
		{"same", "Host", "Host", true},
		{"case differs", "CONTENT-length", "Content-Length", true},
		{"lengths differ", "Host", "Hosts", false},
		{"one letter differs", "Host", "Hast", false},
		{"empty", "", "", true},
		{"not a letter is not folded", "[", "{", false},
		{"the Kelvin sign is not k", "\u212a", "k", false},
		{"a non-ASCII byte is compared as is", "\xc3\x89", "\xc3\xa9", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EqualFold(tc.a, tc.b); got != tc.want {
				t.Errorf("EqualFold(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
			if got := EqualFold([]byte(tc.a), tc.b); got != tc.want {
				t.Errorf("EqualFold([]byte(%q), %q) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
