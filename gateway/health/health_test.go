package health

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// countingRecorder counts the members reported failed for every site.
type countingRecorder struct{ failures atomic.Int64 }

func (r *countingRecorder) UpstreamFailure(string) { r.failures.Add(1) }

// memberStandIn is an http:// member on a free loopback port: answers
// says whether it answers a request (the aliveness question is one) with
// a forward proxy's refusal, or reads it and says nothing (a hung Squid).
// Its port refuses connections until it is up.
type memberStandIn struct {
	ln      net.Listener
	addr    string
	answers atomic.Bool
}

func newMemberStandIn(t *testing.T) *memberStandIn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &memberStandIn{addr: ln.Addr().String()}
	_ = ln.Close() // down until up
	return m
}

// up listens on the member's port again; the test's end closes it.
func (m *memberStandIn) up(t *testing.T, answers bool) {
	t.Helper()
	m.answers.Store(answers)
	var ln net.Listener
	poll.Until(t, 10*time.Second, "the member's port to be free again", func() error {
		var err error
		ln, err = net.Listen("tcp", m.addr)
		return err
	})
	m.ln = ln
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if m.answers.Load() {
					_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
					return
				}
				_, _ = io.Copy(io.Discard, c) // silent until the asker hangs up
			}()
		}
	}()
}

// leased is a store holding the one member, and a lease of it for target.
func leased(t *testing.T, m *memberStandIn, target string) (*pool.Store, Lease) {
	t.Helper()
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{{Name: "squid-a", URL: &url.URL{Scheme: "http", Host: m.addr}}})
	l, err := store.Acquire(context.Background(), pool.AcquireRequest{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := link.NewDialer(time.Second, time.Second, nil, nil).Open(l.Member)
	if err != nil {
		t.Fatal(err)
	}
	return store, Lease{ID: l.ID, Link: mc}
}

// restsForEverySite reports whether the store's one member rests for its
// own failures.
func restsForEverySite(store *pool.Store) bool {
	_, ok := store.Members()[0].Cooldowns[""]
	return ok
}

func newHealth(store *pool.Store, rec Recorder) *Health {
	return New(Options{Pool: store, Recorder: rec, Logger: slog.New(slog.DiscardHandler), DialTimeout: time.Second, FailureWindow: time.Minute})
}

// TestAFailedMemberRestsUntilItAnswersAgainOnlyWhenItWasSilent: a member
// reported failed because it gave no answer at all (refused, reset, timed
// out) is asked every second whether it answers, and its rest ends as soon
// as it does; one that answered wrongly (a 407, a garbled answer) would
// answer that question too, so it rests its whole window.
func TestAFailedMemberRestsUntilItAnswersAgainOnlyWhenItWasSilent(t *testing.T) {
	tests := []struct {
		class    string // the failure's class, as the request path reports it
		restEnds bool
	}{
		{class: "dial", restEnds: true},
		{class: "timeout", restEnds: true},
		{class: "auth", restEnds: false},     // it answered 407
		{class: "protocol", restEnds: false}, // it answered something garbled
	}
	for _, tt := range tests {
		t.Run(tt.class, func(t *testing.T) {
			m := newMemberStandIn(t)
			store, l := leased(t, m, "site.example")
			if err := store.Report(context.Background(), l.ID, pool.Report{Result: rotation.ResultUpstreamFailed}); err != nil {
				t.Fatal(err)
			}
			if !restsForEverySite(store) {
				t.Fatal("the member does not rest after its failure was reported")
			}
			mh := newHealth(store, &countingRecorder{})
			t.Cleanup(mh.Stop)
			mh.MemberFailed(l, tt.class)
			m.up(t, true)
			if tt.restEnds {
				poll.Until(t, 20*time.Second, "the rest to end once the member answers", func() error {
					if restsForEverySite(store) {
						return errors.New("still resting")
					}
					return nil
				})
				return
			}
			// Three rechecks' worth of time: the rest stays.
			time.Sleep(3500 * time.Millisecond)
			if !restsForEverySite(store) {
				t.Fatal("a member that answered wrongly stopped resting because it answers a question")
			}
		})
	}
}

// TestMemberAnsweredEndsTheRestOfAMemberReportedFailed: a request the
// member carried is its answer; a member that never failed reports nothing.
func TestMemberAnsweredEndsTheRestOfAMemberReportedFailed(t *testing.T) {
	m := newMemberStandIn(t)
	store, l := leased(t, m, "site.example")
	mh := newHealth(store, &countingRecorder{})
	t.Cleanup(mh.Stop)
	mh.MemberAnswered(context.Background(), l)
	if restsForEverySite(store) {
		t.Fatal("a member that never failed rests")
	}
	if err := store.Report(context.Background(), l.ID, pool.Report{Result: rotation.ResultUpstreamFailed}); err != nil {
		t.Fatal(err)
	}
	mh.MemberFailed(l, "auth") // no recheck: only the answer ends it
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client left: the report is still made
	mh.MemberAnswered(ctx, l)
	if restsForEverySite(store) {
		t.Fatal("the member rests after it carried a request")
	}
}

// TestCheckAliveTakesOutAMemberThatAnswersNothing: after an answer
// timeout, a member that answers nothing, not even a request it needs no
// site for, is reported failed for every site; one that answers is not.
func TestCheckAliveTakesOutAMemberThatAnswersNothing(t *testing.T) {
	for _, answers := range []bool{true, false} {
		name := map[bool]string{true: "answers", false: "hung"}[answers]
		t.Run(name, func(t *testing.T) {
			m := newMemberStandIn(t)
			m.up(t, answers)
			store, l := leased(t, m, "site.example")
			rec := &countingRecorder{}
			mh := newHealth(store, rec)
			t.Cleanup(mh.Stop)
			mh.CheckAlive(context.Background(), l, "site.example")
			if answers {
				time.Sleep(2 * time.Second) // the question's answer comes at once
				if restsForEverySite(store) || rec.failures.Load() != 0 {
					t.Fatal("a member that answers was taken out")
				}
				return
			}
			poll.Until(t, 20*time.Second, "the hung member to be reported failed", func() error {
				if !restsForEverySite(store) || rec.failures.Load() != 1 {
					return errors.New("not reported")
				}
				return nil
			})
		})
	}
}
