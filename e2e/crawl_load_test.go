package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// crawlLoad is GETs of one URL sent back to back, one worker per client,
// counting what was sent and what failed, while a test breaks something
// underneath (a Redis primary, a controller replica).
type crawlLoad struct {
	sent, failed atomic.Int64
	slowest      atomic.Int64 // milliseconds
	firstFail    atomic.Value
	stop         chan struct{}
	wg           sync.WaitGroup
}

// startCrawl starts one worker per client; end stops them.
func startCrawl(clients []*http.Client, url string) *crawlLoad {
	l := &crawlLoad{stop: make(chan struct{})}
	for _, c := range clients {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				r, err := doGet(c, url, nil)
				if d := time.Since(start).Milliseconds(); d > l.slowest.Load() {
					l.slowest.Store(d)
				}
				l.sent.Add(1)
				if err != nil || r.status != http.StatusOK {
					l.failed.Add(1)
					l.firstFail.CompareAndSwap(nil, fmt.Sprintf("%d %s %v %s", r.status, r.reason, err, strings.TrimSpace(r.body)))
				}
			}
		})
	}
	return l
}

// waitSent waits (up to a minute) until n requests were sent.
func (l *crawlLoad) waitSent(n int64) {
	deadline := time.Now().Add(60 * time.Second)
	for l.sent.Load() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// end stops the workers and waits for them.
func (l *crawlLoad) end() {
	close(l.stop)
	l.wg.Wait()
}

// wantNoFailure fails the test if a request failed across what, or if
// fewer than n requests were sent since the mark after.
func (l *crawlLoad) wantNoFailure(t *testing.T, what string, after, n int64) {
	t.Helper()
	if f := l.failed.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed across %s; first: %v", f, l.sent.Load(), what, l.firstFail.Load())
	}
	if l.sent.Load() < after+n {
		t.Fatalf("only %d requests after %s", l.sent.Load()-after, what)
	}
}
