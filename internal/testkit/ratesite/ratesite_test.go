package ratesite

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestDecide pins each shape's verdicts on a source's requests at given
// offsets from the site's start.
func TestDecide(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		shape Shape
		at    []time.Duration // one source's requests
		want  []bool          // refused
	}{
		{"sliding: the limit+1th within the window bans", Shape{Limit: 3, Window: time.Second, Sliding: true, Ban: 10 * time.Second},
			[]time.Duration{0, 100 * ms, 200 * ms, 300 * ms}, []bool{false, false, false, true}},
		{"sliding: spread past the window is fine", Shape{Limit: 3, Window: time.Second, Sliding: true, Ban: 10 * time.Second},
			[]time.Duration{0, 400 * ms, 800 * ms, 1200 * ms, 1600 * ms, 2000 * ms}, []bool{false, false, false, false, false, false}},
		{"sliding: the ban holds, then ends", Shape{Limit: 1, Window: time.Second, Sliding: true, Ban: 10 * time.Second},
			[]time.Duration{0, 10 * ms, 5 * time.Second, 10*time.Second + 20*ms}, []bool{false, true, true, false}},
		{"fixed: a new window starts over", Shape{Limit: 2, Window: time.Second, Ban: 10 * time.Second},
			[]time.Duration{800 * ms, 900 * ms, 1000 * ms, 1100 * ms}, []bool{false, false, false, false}},
		{"fixed: over within one window bans", Shape{Limit: 2, Window: time.Second, Ban: 10 * time.Second},
			[]time.Duration{100 * ms, 200 * ms, 300 * ms}, []bool{false, false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := New(c.shape)
			for i, at := range c.at {
				got, _ := s.Decide("127.0.0.9", s.start.Add(at))
				if got != c.want[i] {
					t.Fatalf("request %d at %v: refused %v, want %v", i, at, got, c.want[i])
				}
			}
		})
	}
}

// TestSourcesAreCountedApart: one source going over bans it alone; per
// /24, every 127.0.0.x is one source.
func TestSourcesAreCountedApart(t *testing.T) {
	s := New(Shape{Limit: 1, Window: time.Minute, Sliding: true, Ban: time.Minute})
	now := s.start
	if r, _ := s.Decide("127.0.0.1", now); r {
		t.Fatal("first request refused")
	}
	if r, _ := s.Decide("127.0.0.1", now); !r {
		t.Fatal("second request of one source within the window served")
	}
	if r, _ := s.Decide("127.0.0.2", now); r {
		t.Fatal("another source refused for the first's ban")
	}
	p := New(Shape{Limit: 1, Window: time.Minute, Sliding: true, Ban: time.Minute, PerPrefix24: true})
	if p.source("127.0.0.1:5") != p.source("127.0.0.2:6") {
		t.Fatalf("per /24: %s and %s counted apart", p.source("127.0.0.1:5"), p.source("127.0.0.2:6"))
	}
}

// TestServedOverHTTP: the refusal is the shape's status with Retry-After
// when asked, and the stats count it.
func TestServedOverHTTP(t *testing.T) {
	s := Start(t, "127.0.0.1", Shape{Limit: 1, Window: time.Minute, Sliding: true, Ban: 90 * time.Second, Status: http.StatusForbidden, RetryAfter: true})
	get := func() *http.Response {
		r, err := http.Get(s.URL + "/x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return r
	}
	if r := get(); r.StatusCode != 200 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	r := get()
	if r.StatusCode != http.StatusForbidden || r.Header.Get("Retry-After") != "90" {
		t.Fatalf("second: %d Retry-After %q, want 403 and 90", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if ip := net.ParseIP(r.Header.Get(SourceHeader)); ip == nil || !ip.IsLoopback() {
		t.Fatalf("source header %q", r.Header.Get(SourceHeader))
	}
	st := s.Stats()
	if st.Served != 1 || st.Refused != 1 || len(st.Banned()) != 1 {
		t.Fatalf("stats %+v", st)
	}
}
