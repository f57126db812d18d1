// Package pacebench runs a burst crawl through the real gateway and real
// Squids against a rate-limiting site stand-in (internal/testkit/ratesite)
// and reports what it got: requests served, members banned, time to
// finish. The pacing benchmark (make bench) and the pacing acceptance test
// (e2e) share it, so the figures in docs/performance.md are what the test
// asserts on.
package pacebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/ratesite"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// Crawl is a burst crawl: N distinct GETs at concurrency Conc through
// Members members, every request its own member (--rotation per-request).
type Crawl struct {
	N, Conc, Members int
	// Deadline ends a crawl that has not finished (default 10m): what is
	// not served by then is not.
	Deadline time.Duration
}

// Result is what one crawl got.
type Result struct {
	// Served is the requests answered 200; Refused the ones the site's
	// refusal reached the crawler for; Failed the rest (503 no_member,
	// errors). A 503 paced is retried after its Retry-After, as a crawler
	// that honours it does, and counts once it ends.
	Served, Refused, Failed int
	// Paced is the 503 paced answers retried.
	Paced int
	// Banned is the members (source addresses) the site banned.
	Banned []string
	// Time is from the first request to the last answer.
	Time time.Duration
}

func (r Result) String() string {
	return fmt.Sprintf("served %d, refused %d, failed %d, banned %d, %s (503 paced retried %d)", r.Served, r.Refused, r.Failed, len(r.Banned), r.Time.Round(100*time.Millisecond), r.Paced)
}

// Squids are the members a crawl goes through: one real Squid each, with
// its own source address (127.0.2.N) as the site sees it.
type Squids struct {
	all []*squid.Squid
}

// LaunchSquids starts n Squids; Close stops them.
func LaunchSquids(n int) (*Squids, error) {
	s := &Squids{}
	for i := range n {
		sq, err := squid.Launch(squid.Options{Name: "pacebench" + strconv.Itoa(i+1), OutgoingAddr: "127.0.2." + strconv.Itoa(i+1)})
		if err != nil {
			s.Close()
			return nil, err
		}
		s.all = append(s.all, sq)
	}
	return s, nil
}

// Close stops every Squid.
func (s *Squids) Close() {
	for _, sq := range s.all {
		_ = sq.Close()
	}
}

// upstreams is --upstream for the first n.
func (s *Squids) upstreams(n int) []string {
	var out []string
	for _, sq := range s.all[:min(n, len(s.all))] {
		out = append(out, "--upstream", sq.URL())
	}
	return out
}

// Gateway is one running gateway.
type Gateway struct {
	proc *testutil.Process
	// Proxy is its proxy URL.
	Proxy *url.URL
}

// LaunchGateway starts the gateway bin in front of the first members
// Squids, per-request rotation, with args added; Stop ends it.
func LaunchGateway(bin string, sq *Squids, members int, args ...string) (*Gateway, error) {
	proc, addrs, err := testutil.LaunchProcessOnFreePorts(bin, 2, func(addrs []string) testutil.ProcessOptions {
		a := []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1], "--allow-private-targets", "--rotation", "per-request", "--log-level", "warn"}
		a = append(a, sq.upstreams(members)...)
		return testutil.ProcessOptions{Name: "pacebench-gateway", Args: append(a, args...), WaitAddrs: addrs}
	})
	if err != nil {
		return nil, err
	}
	return &Gateway{proc: proc, Proxy: &url.URL{Scheme: "http", Host: addrs[0]}}, nil
}

// Stop ends the gateway; its output is returned when it did not exit
// cleanly.
func (g *Gateway) Stop() error {
	if code, err := g.proc.Stop(); err != nil || code != 0 {
		return fmt.Errorf("gateway exit %d %v\n%s", code, err, g.proc.Output())
	}
	return nil
}

// siteHost is where the crawled site listens: a /24 of its own, apart
// from the members' source addresses.
const siteHost = "127.0.3.1"

// Run crawls a fresh site of shape through a fresh gateway (args added)
// and reports the crawl.
func Run(bin string, sq *Squids, shape ratesite.Shape, c Crawl, args ...string) (Result, error) {
	site, err := ratesite.Launch(siteHost, shape)
	if err != nil {
		return Result{}, err
	}
	defer site.Close()
	gw, err := LaunchGateway(bin, sq, c.Members, args...)
	if err != nil {
		return Result{}, err
	}
	res := crawl(site.URL, []*url.URL{gw.Proxy}, c)
	res.Banned = site.Stats().Banned()
	return res, gw.Stop()
}

// crawl sends c's GETs to base through the proxies (request i through
// proxies[i%len]): each until it is served, refused or failed, a 503
// paced retried after its Retry-After.
func crawl(base string, proxies []*url.URL, c Crawl) Result {
	if c.Deadline <= 0 {
		c.Deadline = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Deadline)
	defer cancel()
	clients := make([]*http.Client, len(proxies))
	for i, p := range proxies {
		clients[i] = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(p), MaxIdleConnsPerHost: c.Conc, DisableCompression: true}, Timeout: 5 * time.Minute}
	}
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	next := make(chan int)
	start := time.Now()
	for range c.Conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out, paced := fetch(ctx, clients[i%len(clients)], fmt.Sprintf("%s/page-%d", base, i))
				mu.Lock()
				res.Paced += paced
				switch out {
				case http.StatusOK:
					res.Served++
				case http.StatusTooManyRequests, http.StatusForbidden:
					res.Refused++
				default:
					res.Failed++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range c.N {
		next <- i
	}
	close(next)
	wg.Wait()
	res.Time = time.Since(start)
	return res
}

// fetch GETs u until an answer other than 503 paced (or ctx ends: 0),
// returning its status and the 503 paced answers it waited out.
func fetch(ctx context.Context, c *http.Client, u string) (status, paced int) {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		r, err := c.Do(req)
		if err != nil {
			return 0, paced
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("X-Proxyfleet-Reason") != "paced" {
			return r.StatusCode, paced
		}
		paced++
		wait := time.Second
		if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		select {
		case <-ctx.Done():
			return 0, paced
		case <-time.After(wait):
		}
	}
}

// Better reports whether a is a better crawl than b: more served, then
// fewer members banned, then sooner.
func Better(a, b Result) bool {
	if a.Served != b.Served {
		return a.Served > b.Served
	}
	if len(a.Banned) != len(b.Banned) {
		return len(a.Banned) < len(b.Banned)
	}
	return a.Time < b.Time
}

// OracleFactors are the intervals the oracle tries, as multiples of the
// shape's Window/Limit (the rate it allows one source); 0 is no interval.
var OracleFactors = []float64{0, 1.05, 1.2, 1.4, 1.7, 2.2}

// Oracle searches the best fixed --site-min-interval for shape (with
// --pacing off: the explicit pace alone), one crawl per candidate, all at
// once: the interval and its crawl.
func Oracle(bin string, sq *Squids, shape ratesite.Shape, c Crawl) (time.Duration, Result, error) {
	type out struct {
		iv  time.Duration
		res Result
		err error
	}
	outs := make([]out, len(OracleFactors))
	var wg sync.WaitGroup
	for i, f := range OracleFactors {
		iv := time.Duration(f * float64(shape.Window) / float64(shape.Limit)).Round(time.Millisecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := Run(bin, sq, shape, c, "--pacing", "off", "--site-min-interval", iv.String(), "--pacing-max-wait", "10m", "--request-timeout", "10m")
			outs[i] = out{iv, res, err}
		}()
	}
	wg.Wait()
	var errs []error
	best := -1
	for i, o := range outs {
		if o.err != nil {
			errs = append(errs, o.err)
			continue
		}
		if best < 0 || Better(o.res, outs[best].res) {
			best = i
		}
	}
	if best < 0 {
		return 0, Result{}, errors.Join(errs...)
	}
	return outs[best].iv, outs[best].res, errors.Join(errs...)
}
