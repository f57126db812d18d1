// Package ratesite is a site stand-in that rate-limits its sources the
// ways crawled sites do, each a parameter of its Shape: a fixed or a
// sliding window of some seconds, a limit of requests in it, counted per
// source address (or per /24), a ban of some length for a source that goes
// over, with or without Retry-After, answered 429 or 403. It is for tests
// and benchmarks of pacing: it tells members apart by the source address
// their requests come from (a Squid with its own tcp_outgoing_address on
// 127.0.0.x), and records what it did: requests served and refused, the
// sources it banned and when.
package ratesite

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SourceHeader is the answer header naming the source the site saw.
const SourceHeader = "X-Seen-Source"

// Shape is one way of rate-limiting a source.
type Shape struct {
	// Limit is how many requests a source may make within Window; the
	// next one within it bans the source.
	Limit int
	// Window is the span the limit counts over.
	Window time.Duration
	// Sliding counts the requests of the last Window before each request;
	// otherwise windows are fixed, starting at the site's start and every
	// Window after (a source may then make 2*Limit across a boundary).
	Sliding bool
	// Ban is how long a source that went over is refused, every request
	// of it in that time answered Status.
	Ban time.Duration
	// RetryAfter adds Retry-After (the seconds left of the ban) to a
	// refusal.
	RetryAfter bool
	// Status is the refusal's status: 429 or 403 (0: 429).
	Status int
	// PerPrefix24 counts and bans per /24 of the source address instead of
	// per address: every member on 127.0.0.x is one source.
	PerPrefix24 bool
	// Latency is how long each answer takes (work on the site's side, so a
	// burst has requests in flight).
	Latency time.Duration
}

// String names the shape compactly, for test names and tables.
func (s Shape) String() string {
	kind := "fixed"
	if s.Sliding {
		kind = "sliding"
	}
	per := "source"
	if s.PerPrefix24 {
		per = "/24"
	}
	ra := ""
	if s.RetryAfter {
		ra = "+Retry-After"
	}
	return fmt.Sprintf("%d/%s-%s-per-%s-ban-%s-%d%s", s.Limit, s.Window, kind, per, s.Ban, s.status(), ra)
}

func (s Shape) status() int {
	if s.Status == 0 {
		return http.StatusTooManyRequests
	}
	return s.Status
}

// Ban is one source the site banned.
type Ban struct {
	Source string
	At     time.Time
	// Count is the requests the source had made in its window, the one
	// that went over included.
	Count int
}

// Site is a running stand-in.
type Site struct {
	shape Shape
	start time.Time
	// URL is the site's base URL (http://127.0.0.x:port).
	URL string

	mu       sync.Mutex
	seen     map[string][]time.Time // sliding: sends in the window; fixed: sends in the current window
	winStart map[string]time.Time   // fixed: the window the sends of seen are in
	until    map[string]time.Time   // banned until
	bans     []Ban
	served   int
	refused  int
}

// Start runs a site of shape on host (an address on 127.0.0.0/8) on a free
// port until the test ends.
func Start(t testing.TB, host string, shape Shape) *Site {
	t.Helper()
	s := New(shape)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.URL = "http://" + ln.Addr().String()
	return s
}

// New is a site of shape not yet serving (Start serves one); its windows
// start now.
func New(shape Shape) *Site {
	return &Site{shape: shape, start: time.Now(), seen: map[string][]time.Time{}, winStart: map[string]time.Time{}, until: map[string]time.Time{}}
}

// source is who the site counts a request against.
func (s *Site) source(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	if s.shape.PerPrefix24 {
		if ip := net.ParseIP(host).To4(); ip != nil {
			return (&net.IPNet{IP: ip.Mask(net.CIDRMask(24, 32)), Mask: net.CIDRMask(24, 32)}).String()
		}
	}
	return host
}

// Decide is the site's verdict on one request of src at now: whether it is
// refused, and for how long more the source is banned.
func (s *Site) Decide(src string, now time.Time) (refused bool, left time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until, ok := s.until[src]; ok {
		if now.Before(until) {
			s.refused++
			return true, until.Sub(now)
		}
		delete(s.until, src)
		delete(s.seen, src)
	}
	sh := s.shape
	if sh.Sliding {
		recent := s.seen[src][:0]
		for _, at := range s.seen[src] {
			if now.Sub(at) < sh.Window {
				recent = append(recent, at)
			}
		}
		s.seen[src] = append(recent, now)
	} else {
		ws := s.start.Add(now.Sub(s.start).Truncate(sh.Window))
		if !s.winStart[src].Equal(ws) {
			s.winStart[src] = ws
			s.seen[src] = s.seen[src][:0]
		}
		s.seen[src] = append(s.seen[src], now)
	}
	if n := len(s.seen[src]); n > sh.Limit {
		s.until[src] = now.Add(sh.Ban)
		s.bans = append(s.bans, Ban{Source: src, At: now, Count: n})
		s.refused++
		return true, sh.Ban
	}
	s.served++
	return false, 0
}

// ServeHTTP answers 200 "ok", or the shape's refusal.
func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := s.source(r.RemoteAddr)
	refused, left := s.Decide(src, time.Now())
	if s.shape.Latency > 0 {
		time.Sleep(s.shape.Latency)
	}
	w.Header().Set(SourceHeader, src)
	if !refused {
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	if s.shape.RetryAfter {
		w.Header().Set("Retry-After", strconv.Itoa(int((left+time.Second-1)/time.Second)))
	}
	w.WriteHeader(s.shape.status())
	_, _ = w.Write([]byte("too many requests from " + src + "\n"))
}

// Stats is what the site did.
type Stats struct {
	Served, Refused int
	// Bans are the bans in the order they fell.
	Bans []Ban
}

// Banned is the distinct sources banned, sorted.
func (st Stats) Banned() []string {
	set := map[string]bool{}
	for _, b := range st.Bans {
		set[b.Source] = true
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Stats returns what the site did so far.
func (s *Site) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Served: s.served, Refused: s.refused, Bans: append([]Ban(nil), s.bans...)}
}
