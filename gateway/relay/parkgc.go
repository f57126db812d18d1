//go:build linux

package relay

import (
	"runtime/debug"
	"sync"
	"time"
)

// Parking (park_linux.go) gives a relay's goroutine up, but the runtime keeps the stacks
// of goroutines that ended until its next collection, which in a process
// whose heap is not growing (a sidecar holding idle tunnels) is the forced
// one every two minutes, and even then the scavenger keeps free memory up
// to about the next heap goal. A burst of tunnels that then go idle (a
// crawler opening its connections at once) held the burst's stacks that
// long: 1,000 of them about 6 MiB of a sidecar's 20. So once a burst of
// parking has been quiet for a while, the parker gives the free memory
// back (debug.FreeOSMemory: a collection, then every free page returned;
// one collection alone returned 4.2 of 7.5 MB here). Under a steady churn
// of tunnels parking is never quiet and nothing is forced: new goroutines
// reuse the freed stacks.
const (
	// parkBurst is how many relays parked since the last collection make
	// a burst worth one.
	parkBurst = 256
	// parkQuiet is how long after the last park of a burst it runs.
	parkQuiet = time.Second
	// parkCollectEvery bounds how often it runs.
	parkCollectEvery = 30 * time.Second
)

// burstCollector runs collect once a burst of parks has gone quiet.
type burstCollector struct {
	burst        int
	quiet, every time.Duration
	collect      func()

	mu    sync.Mutex
	n     int         // parks since the last collection
	timer *time.Timer // armed once n reached burst
	last  time.Time   // the last collection
}

func newBurstCollector(burst int, quiet, every time.Duration, collect func()) *burstCollector {
	return &burstCollector{burst: burst, quiet: quiet, every: every, collect: collect}
}

// parked counts one park; from the burst's size on, each park moves the
// collection to quiet after it.
func (b *burstCollector) parked() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if b.n < b.burst {
		return
	}
	wait := b.quiet
	if since := time.Since(b.last); since < b.every {
		wait = max(wait, b.every-since)
	}
	switch {
	case b.timer == nil:
		b.timer = time.AfterFunc(wait, b.run)
	case b.timer.Stop():
		b.timer.Reset(wait)
	default:
		// It fired: run is under way and counts parks from there.
	}
}

func (b *burstCollector) run() {
	b.mu.Lock()
	b.n, b.timer, b.last = 0, nil, time.Now()
	b.mu.Unlock()
	b.collect()
}

// parkCollector is the parker's.
var parkCollector = newBurstCollector(parkBurst, parkQuiet, parkCollectEvery, debug.FreeOSMemory)
