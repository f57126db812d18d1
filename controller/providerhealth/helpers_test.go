package providerhealth

import (
	"testing"
)

// newMonitor is New for options a test knows to be valid.
func newMonitor(t *testing.T, o Options) *Monitor {
	t.Helper()
	m, err := New(o)
	if err != nil {
		t.Fatalf("providerhealth.New: %v", err)
	}
	return m
}
