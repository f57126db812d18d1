package leases

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestStartReturnsWhenServingFailsWhileCtxLives checks that a server that
// stops on its own (here: its listener closed under it) makes Start return
// the error at once, with ctx still alive. The manager cancels ctx only after
// a runnable has returned its error, so a Start that waited for ctx before
// returning would leave the controller running without a lease API.
func TestStartReturnsWhenServingFailsWhileCtxLives(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	src := newSource(nil, nil, logr.Discard(), sourceOptions{})
	close(src.synced)
	a := &API{
		store:  pool.NewStore(pool.StoreOptions{}),
		source: src,
		ln:     ln,
		srv:    &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second},
		grace:  time.Second,
		log:    logr.Discard(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Start(ctx) }()

	// Wait until it serves, then pull the listener away.
	poll.Until(t, 20*time.Second, "the API to serve on "+ln.Addr().String(), func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	_ = ln.Close()

	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Start returned nil after the server stopped on its own, want the serve error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Start did not return after the server stopped on its own (it waits for ctx, which the manager cancels only after Start returns)")
	}
}

// TestLeaseAPIRunsOnEveryReplica checks that neither the source nor the
// server waits for leader election: a follower serves the lease API too.
func TestLeaseAPIRunsOnEveryReplica(t *testing.T) {
	for name, r := range map[string]manager.Runnable{"source": &Source{}, "server": &API{}} {
		le, ok := r.(manager.LeaderElectionRunnable)
		if !ok || le.NeedLeaderElection() {
			t.Errorf("the lease API %s must run without leader election", name)
		}
	}
}

func TestNewNamesTheBadOption(t *testing.T) {
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme}) // never started: New only keeps it
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no listen address", Options{}, "Options.Listen"},
		{"no Proxy cache", Options{Listen: "127.0.0.1:0"}, "Options.Cache"},
		{"no credentials cache", Options{Listen: "127.0.0.1:0", Cache: c}, "Options.Credentials"},
		{"a negative shutdown grace", Options{Listen: "127.0.0.1:0", Cache: c, Credentials: c, ShutdownGrace: -time.Second}, "Options.ShutdownGrace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a, err := New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				if a != nil {
					_ = a.ln.Close()
				}
				t.Fatalf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
