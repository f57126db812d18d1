package gateway

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// forgetLog records the members whose series a Server dropped.
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

func TestNewServerNeedsExactlyOnePool(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	g, err := New(Options{Pool: store})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leaseapi.NewClient("http://127.0.0.1:1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []ServerOptions{
		{Store: store},
		{Gateway: g},
		{Gateway: g, Store: store, Remote: remote},
	} {
		if _, err := NewServer(o); err == nil {
			t.Errorf("NewServer(%+v) accepted", o)
		}
	}
}

func TestServerReloadKeepsTheStoreGatewayAndMetricsInStep(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	a, b := urlMember(t, "a", "http://127.0.0.1:3128"), urlMember(t, "b", "http://127.0.0.1:3129")
	store.SetMembers([]pool.Member{a, b})
	g, err := New(Options{Pool: store})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.links.memberFor(b); err != nil {
		t.Fatal(err)
	}
	var forgot forgetLog
	srv, err := NewServer(ServerOptions{Gateway: g, Store: store, Forget: &forgot})
	if err != nil {
		t.Fatal(err)
	}
	srv.Reload([]pool.Member{a})
	if ms := store.Members(); len(ms) != 1 || ms[0].Name != "a" {
		t.Fatalf("store members after the reload: %+v", ms)
	}
	if g.links.memberByName("b") != nil {
		t.Fatal("the gateway still holds the removed member")
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
	g, err := New(Options{Pool: remote})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := g.links.memberFor(urlMember(t, "px-1", "http://127.0.0.1:3128"))
	if err != nil {
		t.Fatal(err)
	}
	mc.lastUsed.Store(time.Now().Add(-time.Hour).UnixNano())
	var forgot forgetLog
	srv, err := NewServer(ServerOptions{Gateway: g, Remote: remote, RemoteIdle: 200 * time.Millisecond, Forget: &forgot})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	// Read the member table directly: memberByName would mark it used.
	known := func() bool {
		g.links.mu.RLock()
		defer g.links.mu.RUnlock()
		return g.links.members["px-1"] != nil
	}
	poll.Until(t, 30*time.Second, "px-1 forgotten with its series", func() error {
		if known() || !slices.Equal(forgot.got(), []string{"px-1"}) {
			return fmt.Errorf("member known %v, series forgotten %v", known(), forgot.got())
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

func TestParsePortsReadsACommaSeparatedList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint16
		err  string
	}{
		{in: "80", want: []uint16{80}},
		{in: " 80, 8080 ,80", want: []uint16{80, 8080}},
		{in: "", want: []uint16{}},
		{in: ",", want: []uint16{}},
		{in: "0", err: `"0" is not a port`},
		{in: "65536", err: `"65536" is not a port`},
		{in: "80;81", err: `"80;81" is not a port`},
		{in: "-1", err: `"-1" is not a port`},
	} {
		got, err := ParsePorts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePorts(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) || got == nil {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v (never nil: nil is the default)", tc.in, got, err, tc.want)
		}
	}
}
