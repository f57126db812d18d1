package gc

import (
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	minAge := 10 * time.Minute
	live := map[string]struct{}{"uid-live": {}}
	old := now.Add(-time.Hour)

	tests := []struct {
		name string
		inst providers.Instance
		want Decision
	}{
		{"an old tagged instance of no Proxy is an orphan", providers.Instance{OwnerUID: "uid-gone", CreatedAt: old}, Delete},
		{"an instance exactly MinAge old is an orphan", providers.Instance{OwnerUID: "uid-gone", CreatedAt: now.Add(-minAge)}, Delete},
		{"an instance without the UID label is never deleted", providers.Instance{CreatedAt: old}, KeepUntagged},
		{"an instance of a live Proxy stays", providers.Instance{OwnerUID: "uid-live", CreatedAt: old}, KeepLive},
		{"an instance younger than MinAge stays", providers.Instance{OwnerUID: "uid-gone", CreatedAt: now.Add(-minAge + time.Second)}, KeepYoung},
		{"an instance created in the future (clock skew) stays", providers.Instance{OwnerUID: "uid-gone", CreatedAt: now.Add(time.Minute)}, KeepYoung},
		{"an instance without a creation time stays", providers.Instance{OwnerUID: "uid-gone"}, KeepUnknownAge},
		{"an untagged young instance is reported untagged", providers.Instance{CreatedAt: now}, KeepUntagged},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.inst, live, now, minAge); got != tc.want {
				t.Fatalf("Decide(%+v) = %s, want %s", tc.inst, got, tc.want)
			}
		})
	}
}
