package gateway

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/ratesite"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// crawlResult is what a burst crawl got: answers by status (0: a
// transport error) and how long it took.
type crawlResult struct {
	status map[int]int
	took   time.Duration
}

// burstCrawl sends n GETs of distinct pages of url through c at
// concurrency conc, as a crawler's worker threads do.
func burstCrawl(c *http.Client, url string, n, conc int) crawlResult {
	var mu sync.Mutex
	got := map[int]int{}
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				resp, err := c.Get(fmt.Sprintf("%s/page-%d", url, i))
				mu.Lock()
				if err != nil {
					got[0]++
				} else {
					got[resp.StatusCode]++
					resp.Body.Close()
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return crawlResult{status: got, took: time.Since(start)}
}

// siteHosts hands each crawl its own site address.
var siteHosts atomic.Int32

// runCrawl is one burst crawl of n pages at concurrency conc through m
// members with their own source addresses (directMembers), against a
// fresh site of shape.
func runCrawl(b testing.TB, shape ratesite.Shape, m, conc, n int, o PacingOptions) (crawlResult, ratesite.Stats) {
	members := directMembers(m)
	e := newEnv(b, paceOptions(o), pool.StoreOptions{}, members...)
	site := ratesite.Start(b, fmt.Sprintf("127.0.0.%d", 200+siteHosts.Add(1)%50), shape)
	r := burstCrawl(e.client("", ""), site.URL, n, conc)
	return r, site.Stats()
}

// BenchmarkPacingAgainstRateLimitShapes is a burst crawl of 60 pages
// through 3 members against rate-limit shapes of the site stand-in
// (internal/testkit/ratesite), three ways: the learning rule (a 5s
// window, scaled to the shapes' windows), the fixed first cut (the
// automatic pacing before it), and no automatic pacing. It reports the
// requests served, the members banned and the seconds taken.
//
//	go test -run x -bench BenchmarkPacingAgainstRateLimitShapes -benchtime 1x ./gateway/
func BenchmarkPacingAgainstRateLimitShapes(b *testing.B) {
	shapes := []ratesite.Shape{
		{Limit: 5, Window: 2 * time.Second, Sliding: true, Ban: time.Minute, Latency: 20 * time.Millisecond},
		{Limit: 3, Window: 3 * time.Second, Sliding: true, Ban: time.Minute, Latency: 5 * time.Millisecond},
		{Limit: 5, Window: 2 * time.Second, Status: 403, Ban: time.Minute, Latency: 5 * time.Millisecond},
		{Limit: 10, Window: 5 * time.Second, Sliding: true, Ban: time.Minute, RetryAfter: true, Latency: 5 * time.Millisecond},
	}
	modes := []struct {
		name string
		o    PacingOptions
	}{
		{"rule", PacingOptions{Auto: true, Rule: rotation.PaceRule{Window: 5 * time.Second, IncreaseSteps: 50, Memory: time.Hour}}},
		{"fixed-cut", PacingOptions{Auto: true}},
		{"off", PacingOptions{}},
	}
	for _, shape := range shapes {
		for _, conc := range []int{4, 16} {
			for _, m := range modes {
				b.Run(fmt.Sprintf("%v/conc-%d/%s", shape, conc, m.name), func(b *testing.B) {
					for b.Loop() {
						r, st := runCrawl(b, shape, 3, conc, 60, m.o)
						b.ReportMetric(float64(r.status[200]), "served")
						b.ReportMetric(float64(len(st.Banned())), "banned")
						b.ReportMetric(r.took.Seconds(), "s")
					}
				})
			}
		}
	}
}
