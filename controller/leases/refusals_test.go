package leases

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxyfleet/proxyfleet/pool"
)

func TestRefusalLogFindsTheLatestMatchingRefusalWithinAMinute(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l := newRefusalLog(clk)
	euOnly := func(sel map[string]string, proxy string) bool {
		return proxy == "" && (sel["region"] == "" || sel["region"] == "eu")
	}

	l.record(pool.AcquireRequest{Selector: map[string]string{"region": "us"}})
	if got := l.lastMatching(euOnly); !got.IsZero() {
		t.Errorf("a refusal for region=us matched the eu pool at %s", got)
	}
	l.record(pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
	at := clk.Now()
	clk.SetTime(at.Add(30 * time.Second))
	if got := l.lastMatching(euOnly); !got.Equal(at) {
		t.Errorf("last eu refusal = %s, want %s", got, at)
	}
	clk.SetTime(clk.Now().Add(31 * time.Second))
	if got := l.lastMatching(euOnly); !got.IsZero() {
		t.Errorf("a refusal older than a minute still counts: %s", got)
	}
}

func TestRefusalLogIsBounded(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l := newRefusalLog(clk)
	for i := range maxRefusalKeys + 100 {
		clk.SetTime(clk.Now().Add(time.Millisecond))
		l.record(pool.AcquireRequest{Selector: map[string]string{"session": fmt.Sprint(i)}})
	}
	if n := len(l.last); n > maxRefusalKeys {
		t.Errorf("%d distinct refusals kept, want at most %d", n, maxRefusalKeys)
	}
	if got := l.lastMatching(func(map[string]string, string) bool { return true }); !got.Equal(clk.Now()) {
		t.Errorf("the newest refusal was dropped: last %s, want %s", got, clk.Now())
	}
}
