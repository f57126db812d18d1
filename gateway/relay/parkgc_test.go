//go:build linux

package relay

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestABurstOfParksCollectsOnceItIsQuiet: fewer parks than a burst
// collect nothing; a burst collects once, after it went quiet; another
// burst within the interval waits for the interval.
func TestABurstOfParksCollectsOnceItIsQuiet(t *testing.T) {
	var runs atomic.Int32
	b := newBurstCollector(10, 20*time.Millisecond, time.Hour, func() { runs.Add(1) })
	for range 9 {
		b.parked()
	}
	time.Sleep(200 * time.Millisecond)
	if n := runs.Load(); n != 0 {
		t.Fatalf("9 parks (a burst is 10) collected %d times", n)
	}
	b.parked()
	poll.Until(t, 10*time.Second, "the burst's collection", func() error {
		if runs.Load() != 1 {
			return errors.New("not collected")
		}
		return nil
	})
	for range 30 {
		b.parked()
	}
	time.Sleep(200 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("a second burst within the interval (an hour) collected: %d collections", n)
	}
}

// TestParksAfterTheBurstPutTheCollectionOff: while parks go on, the
// collection waits for them to stop (new goroutines reuse the freed
// stacks), then runs once.
func TestParksAfterTheBurstPutTheCollectionOff(t *testing.T) {
	var runs atomic.Int32
	var at atomic.Int64
	const quiet = time.Second
	b := newBurstCollector(1, quiet, 0, func() { runs.Add(1); at.Store(time.Now().UnixNano()) })
	var lastPark time.Time
	for range 10 {
		lastPark = time.Now()
		b.parked()
		time.Sleep(10 * time.Millisecond)
	}
	poll.Until(t, 10*time.Second, "the collection", func() error {
		if runs.Load() == 0 {
			return errors.New("not collected")
		}
		return nil
	})
	if ran := time.Unix(0, at.Load()); ran.Before(lastPark.Add(quiet)) {
		t.Fatalf("collected %v after the last park, before the quiet time (%v) had passed", ran.Sub(lastPark), quiet)
	}
	time.Sleep(100 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d collections for one burst", n)
	}
}
