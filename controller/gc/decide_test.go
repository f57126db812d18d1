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
	const us = "install-a"

	tests := []struct {
		name string
		inst providers.Instance
		want decision
	}{
		{"an old tagged instance of no Proxy is an orphan", providers.Instance{Installation: us, OwnerUID: "uid-gone", CreatedAt: old}, deleteOrphan},
		{"an instance exactly MinAge old is an orphan", providers.Instance{Installation: us, OwnerUID: "uid-gone", CreatedAt: now.Add(-minAge)}, deleteOrphan},
		{"an instance without the UID label is never deleted", providers.Instance{CreatedAt: old}, keepUntagged},
		{"an instance of a live Proxy stays", providers.Instance{Installation: us, OwnerUID: "uid-live", CreatedAt: old}, keepLive},
		{"an instance younger than MinAge stays", providers.Instance{Installation: us, OwnerUID: "uid-gone", CreatedAt: now.Add(-minAge + time.Second)}, keepYoung},
		{"an instance created in the future (clock skew) stays", providers.Instance{Installation: us, OwnerUID: "uid-gone", CreatedAt: now.Add(time.Minute)}, keepYoung},
		{"an instance without a creation time stays", providers.Instance{Installation: us, OwnerUID: "uid-gone"}, keepUnknownAge},
		{"an untagged young instance is reported untagged", providers.Instance{CreatedAt: now}, keepUntagged},
		{"an old orphan of another installation sharing the backend stays", providers.Instance{Installation: "install-b", OwnerUID: "uid-gone", CreatedAt: old}, keepForeign},
		{"an old orphan made before installations were tagged stays", providers.Instance{OwnerUID: "uid-gone", CreatedAt: old}, keepForeign},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.inst, live, us, now, minAge); got != tc.want {
				t.Fatalf("decide(%+v) = %s, want %s", tc.inst, got, tc.want)
			}
		})
	}
}
