package rotation

import (
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"sticky", ModeSticky, false},
		{"request", ModeRequest, false},
		{"per-request", ModeRequest, false},
		{"Per-Request", ModeRequest, false},
		{" sticky ", ModeSticky, false},
		{"", "", true},
		{"random", "", true},
		{"perrequest", "", true},
	}
	for _, tc := range tests {
		t.Run("input "+tc.in, func(t *testing.T) {
			got, err := ParseMode(tc.in)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "sticky") || !strings.Contains(err.Error(), tc.in) {
					t.Fatalf("ParseMode(%q) error = %v, want one naming the value and the choices", tc.in, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ParseMode(%q) = (%q, %v), want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		method  string
		hasBody bool
		want    bool
	}{
		{"GET", false, true},
		{"HEAD", false, true},
		{"OPTIONS", false, true},
		{"TRACE", false, true},
		{"GET", true, false},
		{"POST", false, false},
		{"PUT", false, false},
		{"DELETE", false, false},
		{"PATCH", false, false},
		{"CONNECT", false, false},
		{"get", false, false},
	}
	for _, tc := range tests {
		name := tc.method
		if tc.hasBody {
			name += " with body"
		}
		t.Run(name, func(t *testing.T) {
			if got := Retryable(tc.method, tc.hasBody); got != tc.want {
				t.Errorf("Retryable(%q, %v) = %v, want %v", tc.method, tc.hasBody, got, tc.want)
			}
		})
	}
}
