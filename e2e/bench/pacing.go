package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/pacebench"
	"github.com/proxyfleet/proxyfleet/internal/testkit/ratesite"
)

// pacingCase is one row of the pacing sweep: a site's shape and the crawl.
type pacingCase struct {
	shape ratesite.Shape
	crawl pacebench.Crawl
}

// pacingCases are the shapes of the sweep (docs/performance.md "Pacing
// against rate limits"): windows of 1 s to 60 s, fixed and sliding, limits
// of 3 to 100, bans of 10 s to 1 h, with and without Retry-After, 429 and
// 403, through 3 to 10 members at concurrency 4 to 16; the crawl is long
// enough to need the limit (twice what the members may make in one
// window, at least 60). The last is a limit per /24, which no pace per
// member can meet.
func pacingCases() []pacingCase {
	ms := time.Millisecond
	c := func(l int, w time.Duration, sliding bool, ban time.Duration, status int, ra bool, members, conc int) pacingCase {
		sh := ratesite.Shape{Limit: l, Window: w, Sliding: sliding, Ban: ban, Status: status, RetryAfter: ra, Latency: 20 * ms}
		return pacingCase{sh, pacebench.Crawl{N: max(60, 2*members*l), Conc: conc, Members: members, Deadline: 15 * time.Minute}}
	}
	cases := []pacingCase{
		c(5, 2*time.Second, true, time.Minute, http.StatusTooManyRequests, false, 3, 4),
		c(3, time.Second, false, 10*time.Second, http.StatusTooManyRequests, true, 3, 8),
		c(10, 10*time.Second, true, time.Hour, http.StatusForbidden, false, 5, 16),
		c(20, 5*time.Second, false, time.Minute, http.StatusForbidden, true, 10, 16),
		c(5, time.Minute, true, time.Hour, http.StatusTooManyRequests, false, 3, 4),
		c(100, time.Minute, false, 10*time.Minute, http.StatusTooManyRequests, true, 3, 16),
	}
	per24 := c(10, 10*time.Second, true, time.Minute, http.StatusTooManyRequests, false, 3, 8)
	per24.shape.PerPrefix24 = true
	return append(cases, per24)
}

// pacingRow is one case's three crawls.
type pacingRow struct {
	c                  pacingCase
	auto, none, oracle pacebench.Result
	oracleIv           time.Duration
	errs               [3]error
}

// pacingBench runs every case three ways, all at once (each crawl on a
// site and a gateway of its own, the Squids shared: the site counts per
// source, so runs never meet): automatic pacing (the defaults), no pacing
// (--pacing off), and the oracle (the best fixed --site-min-interval).
func pacingBench(bin string, only string) error {
	sq, err := pacebench.LaunchSquids(10)
	if err != nil {
		return err
	}
	defer sq.Close()
	var rows []*pacingRow
	var wg sync.WaitGroup
	for _, c := range pacingCases() {
		if only != "" && !strings.Contains(c.shape.String(), only) {
			continue
		}
		r := &pacingRow{c: c}
		rows = append(rows, r)
		wg.Add(3)
		go func() { defer wg.Done(); r.auto, r.errs[0] = pacebench.Run(bin, sq, c.shape, c.crawl) }()
		go func() {
			defer wg.Done()
			r.none, r.errs[1] = pacebench.Run(bin, sq, c.shape, c.crawl, "--pacing", "off")
		}()
		go func() { defer wg.Done(); r.oracleIv, r.oracle, r.errs[2] = pacebench.Oracle(bin, sq, c.shape, c.crawl) }()
	}
	wg.Wait()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "shape	members×conc, requests	automatic: served, banned, time	no pacing	oracle (best --site-min-interval)	auto vs oracle: served, time")
	for _, r := range rows {
		for _, e := range r.errs {
			if e != nil {
				return fmt.Errorf("%s: %w", r.c.shape, e)
			}
		}
		fmt.Fprintf(tw, "%s\t%d×%d, %d\t%s\t%s\t%s at %s\t%s\n", r.c.shape, r.c.crawl.Members, r.c.crawl.Conc, r.c.crawl.N,
			cell(r.auto), cell(r.none), cell(r.oracle), r.oracleIv, ratio(r.auto, r.oracle))
	}
	return tw.Flush()
}

func cell(r pacebench.Result) string {
	return fmt.Sprintf("%d, %d, %s", r.Served, len(r.Banned), r.Time.Round(100*time.Millisecond))
}

func ratio(a, o pacebench.Result) string {
	if o.Served == 0 || o.Time <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f %%, %.1f×", 100*float64(a.Served)/float64(o.Served), a.Time.Seconds()/o.Time.Seconds())
}
