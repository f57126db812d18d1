package daemon

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// forgetLog records the members whose series a server dropped.
type forgetLog struct {
	mu    sync.Mutex
	names []string
}

func (f *forgetLog) ForgetMember(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names = append(f.names, name)
}

func (f *forgetLog) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.names)
}

func urlMember(t *testing.T, name, raw string) pool.Member {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return pool.Member{Name: name, URL: u}
}

// forgetting is the real gateway, with the members it was told to forget
// recorded, and those it would forget as idle given by the test: which
// members a gateway holds is its own business (member_test.go in package
// gateway), what the server does with them is this file's.
type forgetting struct {
	*gateway.Gateway
	told forgetLog
	idle func(time.Duration) []string
}

func (g *forgetting) ForgetMember(name string) {
	g.told.ForgetMember(name)
	g.Gateway.ForgetMember(name)
}

func (g *forgetting) ForgetIdleMembers(idle time.Duration) []string {
	if g.idle != nil {
		return g.idle(idle)
	}
	return g.Gateway.ForgetIdleMembers(idle)
}

func TestNewServerNeedsExactlyOnePool(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	g, err := gateway.New(gateway.Options{Pool: store})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leaseapi.NewClient("http://127.0.0.1:1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []serverOptions{
		{Store: store},
		{Gateway: g},
		{Gateway: g, Store: store, Remote: remote},
	} {
		if _, err := newServer(o); err == nil {
			t.Errorf("newServer(%+v) accepted", o)
		}
	}
}

func TestServerReloadKeepsTheStoreGatewayAndMetricsInStep(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	a, b := urlMember(t, "a", "http://127.0.0.1:3128"), urlMember(t, "b", "http://127.0.0.1:3129")
	store.SetMembers([]pool.Member{a, b})
	gw, err := gateway.New(gateway.Options{Pool: store})
	if err != nil {
		t.Fatal(err)
	}
	g := &forgetting{Gateway: gw}
	var forgot forgetLog
	srv, err := newServer(serverOptions{Gateway: g, Store: store, Forget: &forgot})
	if err != nil {
		t.Fatal(err)
	}
	srv.Reload([]pool.Member{a})
	if ms := store.Members(); len(ms) != 1 || ms[0].Name != "a" {
		t.Fatalf("store members after the reload: %+v", ms)
	}
	if got := g.told.got(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("the gateway was told to forget %v, want [b]", got)
	}
	if got := forgot.got(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("series forgotten: %v, want [b]", got)
	}
}

func TestServerForgetsRemoteMembersNoRequestUsed(t *testing.T) {
	remote, err := leaseapi.NewClient("http://127.0.0.1:1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Options{Pool: remote})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway holds px-1, unused for an hour, until it forgets it.
	var mu sync.Mutex
	known := true
	g := &forgetting{Gateway: gw, idle: func(idle time.Duration) []string {
		mu.Lock()
		defer mu.Unlock()
		if !known || idle != 200*time.Millisecond {
			return nil
		}
		known = false
		return []string{"px-1"}
	}}
	var forgot forgetLog
	srv, err := newServer(serverOptions{Gateway: g, Remote: remote, RemoteIdle: 200 * time.Millisecond, Forget: &forgot})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	poll.Until(t, 30*time.Second, "px-1 forgotten with its series", func() error {
		mu.Lock()
		k := known
		mu.Unlock()
		if k || !slices.Equal(forgot.got(), []string{"px-1"}) {
			return fmt.Errorf("member known %v, series forgotten %v", k, forgot.got())
		}
		return nil
	})
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
