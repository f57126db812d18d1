package leaseapi

import (
	"fmt"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

func TestRefusalLogFindsTheLatestMatchingRefusalWithinAMinute(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newRefusalLog(func() time.Time { return now })
	euOnly := func(sel map[string]string, proxy string) bool {
		return proxy == "" && (sel["region"] == "" || sel["region"] == "eu")
	}

	l.record(pool.AcquireRequest{Selector: map[string]string{"region": "us"}})
	if got := l.lastMatching(euOnly); !got.IsZero() {
		t.Errorf("a refusal for region=us matched the eu pool at %s", got)
	}
	l.record(pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
	at := now
	now = now.Add(30 * time.Second)
	if got := l.lastMatching(euOnly); !got.Equal(at) {
		t.Errorf("last eu refusal = %s, want %s", got, at)
	}
	now = now.Add(31 * time.Second)
	if got := l.lastMatching(euOnly); !got.IsZero() {
		t.Errorf("a refusal older than a minute still counts: %s", got)
	}
}

func TestRefusalLogIsBounded(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newRefusalLog(func() time.Time { return now })
	for i := range maxRefusalKeys + 100 {
		now = now.Add(time.Millisecond)
		l.record(pool.AcquireRequest{Selector: map[string]string{"session": fmt.Sprint(i)}})
	}
	if n := len(l.last); n > maxRefusalKeys {
		t.Errorf("%d distinct refusals kept, want at most %d", n, maxRefusalKeys)
	}
	if got := l.lastMatching(func(map[string]string, string) bool { return true }); !got.Equal(now) {
		t.Errorf("the newest refusal was dropped: last %s, want %s", got, now)
	}
}
