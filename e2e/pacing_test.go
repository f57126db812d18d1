package e2e

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// limitSite is a site stand-in that rate-limits the way crawled sites do:
// a source that makes more than k requests within t is banned (403) for
// good. It records which sources had a request in flight when it banned
// its first source: the requests no gateway could still have held back.
type limitSite struct {
	k   int
	t   time.Duration
	url string

	mu          sync.Mutex
	seen        map[string][]time.Time
	inflight    map[string]int
	banned      map[string]bool
	atFirstBan  map[string]bool // sources in flight when the first ban fell
	served, ban int
}

func startLimitSite(t *testing.T, host string, k int, window time.Duration) *limitSite {
	t.Helper()
	s := &limitSite{k: k, t: window, seen: map[string][]time.Time{}, inflight: map[string]int{}, banned: map[string]bool{}}
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.url = "http://" + ln.Addr().String()
	return s
}

func (s *limitSite) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src, _, _ := net.SplitHostPort(r.RemoteAddr)
	now := time.Now()
	s.mu.Lock()
	s.inflight[src]++
	recent := s.seen[src][:0]
	for _, at := range s.seen[src] {
		if now.Sub(at) < s.t {
			recent = append(recent, at)
		}
	}
	s.seen[src] = append(recent, now)
	if !s.banned[src] && len(s.seen[src]) > s.k {
		s.banned[src] = true
		if s.atFirstBan == nil {
			s.atFirstBan = map[string]bool{}
			for o, n := range s.inflight {
				if n > 0 {
					s.atFirstBan[o] = true
				}
			}
		}
	}
	banned := s.banned[src]
	if banned {
		s.ban++
	} else {
		s.served++
	}
	s.mu.Unlock()
	// A little work, so that a burst has requests in flight.
	time.Sleep(20 * time.Millisecond)
	w.Header().Set(testutil.SeenSourceHeader, src)
	if banned {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("banned: too many requests from " + src + "\n"))
	} else {
		_, _ = w.Write([]byte("ok\n"))
	}
	s.mu.Lock()
	s.inflight[src]--
	s.mu.Unlock()
}

// state is what the site did: its banned sources and those in flight at
// its first ban, sorted.
func (s *limitSite) state() (banned, inFlightAtFirstBan []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for b := range s.banned {
		banned = append(banned, b)
	}
	for b := range s.atFirstBan {
		inFlightAtFirstBan = append(inFlightAtFirstBan, b)
	}
	sort.Strings(banned)
	sort.Strings(inFlightAtFirstBan)
	return banned, inFlightAtFirstBan
}

// burst sends n GETs through c at concurrency conc and counts the answers
// by status (0: a transport error).
func burst(c *http.Client, url string, n, conc int) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := doGet(c, fmt.Sprintf("%s/page-%d", url, i), nil)
				mu.Lock()
				if err != nil {
					got[0]++
				} else {
					got[r.status]++
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
	return got
}

// TestGatewayPacingStopsTheWaterfall is the waterfall of bans a site that
// allows 5 requests per source within 2s makes of a 60-request burst at
// concurrency 4 through three Squids, three ways: with --pacing off every
// member is burnt; with nothing configured (--pacing auto) the first ban
// slows the site for the pool at once, so only the members that had a
// request in flight then are banned and nearly every request is served;
// with --site-min-interval below the site's limit nothing is banned.
func TestGatewayPacingStopsTheWaterfall(t *testing.T) {
	bin := testutil.BuildBinary(t)
	const (
		k      = 5
		window = 2 * time.Second
		n      = 60
		conc   = 4
	)
	run := func(t *testing.T, squidName, siteHost string, outgoing []string, args ...string) (map[int]int, []string, []string, time.Duration) {
		squids := startSquids(t, squidName, outgoing...)
		site := startLimitSite(t, siteHost, k, window)
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), args: append([]string{"--cooldown", "10m"}, args...)})
		c := g.client(t, "", nil)
		c.Timeout = 90 * time.Second
		start := time.Now()
		got := burst(c, site.url, n, conc)
		banned, inFlight := site.state()
		return got, banned, inFlight, time.Since(start)
	}

	t.Run("pacing off: the whole pool burnt", func(t *testing.T) {
		t.Parallel()
		got, banned, _, d := run(t, "paceoff", "127.0.0.184", []string{"127.0.0.171", "127.0.0.172", "127.0.0.173"}, "--pacing", "off")
		t.Logf("pacing off: answers %v, banned %v, %v", got, banned, d)
		if len(banned) != 3 {
			t.Fatalf("banned %v, want all three members (the waterfall)", banned)
		}
		if got[200] > 3*k+1 {
			t.Fatalf("%d requests served, want at most the site's allowance (%d per member)", got[200], k)
		}
	})
	t.Run("nothing configured: at most the members in flight at the first ban", func(t *testing.T) {
		t.Parallel()
		got, banned, inFlight, d := run(t, "paceauto", "127.0.0.185", []string{"127.0.0.174", "127.0.0.175", "127.0.0.176"})
		t.Logf("pacing auto: answers %v, banned %v, in flight at the first ban %v, %v", got, banned, inFlight, d)
		for _, b := range banned {
			if !strings.Contains(strings.Join(inFlight, " "), b) {
				t.Fatalf("%s was banned but had no request in flight at the first ban (%v): the slow-down came too late", b, inFlight)
			}
		}
		if len(banned) == 3 {
			t.Fatalf("all three members banned: %v", banned)
		}
		if got[200] < n-conc {
			t.Fatalf("%d of %d requests served (%v), want nearly all", got[200], n, got)
		}
	})
	t.Run("--site-min-interval below the limit: all served, no ban", func(t *testing.T) {
		t.Parallel()
		// 5 per 2s is one per 400ms; 600ms keeps a margin for the jitter
		// between the gateway's slot and the site's clock.
		got, banned, _, d := run(t, "paceiv", "127.0.0.186", []string{"127.0.0.177", "127.0.0.178", "127.0.0.179"}, "--site-min-interval", "600ms")
		t.Logf("--site-min-interval 600ms: answers %v, banned %v, %v", got, banned, d)
		if len(banned) != 0 || got[200] != n {
			t.Fatalf("answers %v, banned %v: want all %d served and nobody banned", got, banned, n)
		}
	})
}

// TestGatewayPacedAndStrictSessions: a request whose slot is past
// --pacing-max-wait is answered 503 paced with Retry-After and the limit;
// a strict session whose member is banned fails session_lost, and its next
// request too, while other sessions go on.
func TestGatewayPacedAndStrictSessions(t *testing.T) {
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "pacedstrict", "127.0.0.181", "127.0.0.182")
	paced := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.187"})
	strict := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.188"})
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), args: []string{
		"--site-pace", "127.0.0.187 min-interval=20s", "--pacing-max-wait", "1s", "--pacing", "off"}})
	c := g.client(t, "", nil)

	var refused getResult
	var retryAfter string
	for i := range 4 {
		req, _ := http.NewRequest(http.MethodGet, paced.URL()+"/p"+strconv.Itoa(i), nil)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			refused = mustGet(t, c, paced.URL()+"/again", nil)
			retryAfter = resp.Header.Get("Retry-After")
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the paced answer took %v", d)
			}
			break
		}
		if resp.StatusCode != 200 {
			t.Fatalf("GET %d: %d", i, resp.StatusCode)
		}
	}
	if refused.reason != "paced" || !strings.Contains(refused.body, "one request per 20s per member (--site-pace)") {
		t.Fatalf("no paced refusal naming the limit: %+v", refused)
	}
	if n, err := strconv.Atoi(retryAfter); err != nil || n < 1 || n > 20 {
		t.Fatalf("Retry-After %q, want the seconds to the next slot", retryAfter)
	}

	sc := g.client(t, "crawler-session-cart-strict-1", nil)
	first := mustGetOK(t, sc, strict.URL()+"/login", nil)
	strict.SetRule(first.source, http.StatusForbidden, nil)
	for _, path := range []string{"/cart", "/checkout"} {
		r := mustGet(t, sc, strict.URL()+path, nil)
		if r.status != http.StatusBadGateway || r.reason != "session_lost" || r.source != "" {
			t.Fatalf("strict %s after the ban: %d %q from %q, want 502 session_lost and no other member's answer", path, r.status, r.reason, r.source)
		}
	}
	other := mustGetOK(t, g.client(t, "crawler-session-cart2", nil), strict.URL()+"/login", nil)
	if other.source == first.source {
		t.Fatalf("a non-strict session went through the banned member")
	}
}
