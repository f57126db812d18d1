package providers

import (
	"regexp"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNameFromUIDGolden(t *testing.T) {
	// Computed independently: printf %s UID | sha256sum | xxd -r -p | base32 | tr A-Z a-z | cut -c1-16
	tests := []struct{ uid, want string }{
		{"3f0b2c4e-1a2b-4c3d-9e8f-0123456789ab", "proxy-pnutq2sxfx2whg6d"},
		{"", "proxy-4oymiquy7qobjgx3"},
	}
	for _, tt := range tests {
		t.Run("uid "+tt.uid, func(t *testing.T) {
			if got := NameFromUID(tt.uid); got != tt.want {
				t.Fatalf("NameFromUID(%q) = %q, want %q", tt.uid, got, tt.want)
			}
		})
	}
}

func TestNameFromUIDIsLegalEverywhere(t *testing.T) {
	gcpName := regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	seen := map[string]string{}
	for _, uid := range []string{"a", "b", "0c5b7e2a-9d8f-4e3a-b1c2-d3e4f5a6b7c8", "UPPER-case-UID", "ünïcödé"} {
		name := NameFromUID(uid)
		if len(name) != 22 {
			t.Errorf("%q: len %d, want 22", name, len(name))
		}
		if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
			t.Errorf("%q is not a DNS-1123 label (Pod name, hostname): %v", name, msgs)
		}
		if !gcpName.MatchString(name) {
			t.Errorf("%q is not a legal GCP instance name", name)
		}
		if NameFromUID(uid) != name {
			t.Errorf("NameFromUID(%q) is not deterministic", uid)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("%q and %q map to the same name %q", uid, other, name)
		}
		seen[name] = uid
	}
}
