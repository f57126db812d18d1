package gateway

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// laterPool is the in-process store offering pool.LaterReleaser, as the
// Redis store does; it records the leases that came back that way.
type laterPool struct {
	*pool.Store
	mu    sync.Mutex
	later []string
}

func (p *laterPool) ReleaseLater(id string) {
	p.mu.Lock()
	p.later = append(p.later, id)
	p.mu.Unlock()
	_ = p.Store.Release(context.Background(), id)
}

func (p *laterPool) released() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.later)
}

func TestPerRequestLeasesGoBackByReleaseLaterWhenThePoolOffersIt(t *testing.T) {
	p := &laterPool{Store: pool.NewStore(pool.StoreOptions{})}
	p.SetMembers(directMembers(2))
	gw, err := New(Options{Pool: p, Mode: rotation.ModeRequest, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveGateway(t, gw)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	c := testutil.MustProxyClient(t, "http://"+addr, nil)
	var leases []string
	for i := range 3 {
		resp, _ := get(t, c, tg.URL()+"/x", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		leases = append(leases, resp.Header.Get(HeaderLease))
	}
	// A lease goes back as its request ends, which may be just after the
	// client has read the answer.
	poll.Until(t, 10*time.Second, "every request's lease released later", func() error {
		got := p.released()
		return poll.Check(slices.Equal(got, leases) && p.ActiveLeases() == 0,
			"released later %v, want %v; %d leases active", got, leases, p.ActiveLeases())
	})
}

// TestAStoppingGatewayHandsItsPinnedLeasesBack: a sticky (session, site)
// keeps its lease between requests; when the gateway stops (a sidecar whose
// crawler finished) the lease goes back to the pool at once instead of
// counting against its member for the rest of the TTL.
func TestAStoppingGatewayHandsItsPinnedLeasesBack(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers(directMembers(2))
	gw, err := New(Options{Pool: store, Mode: rotation.ModeSticky, LeaseTTL: time.Hour, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveGateway(t, gw)
	a := testutil.StartTarget(t, testutil.TargetOptions{})
	b := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.9"}) // another site
	c := testutil.MustProxyClient(t, "http://"+addr, nil)
	for _, u := range []string{a.URL(), b.URL(), a.URL()} {
		if resp, _ := get(t, c, u+"/x", nil); resp.StatusCode != 200 {
			t.Fatalf("GET %s: status %d", u, resp.StatusCode)
		}
	}
	if n := store.ActiveLeases(); n != 2 {
		t.Fatalf("%d leases held between requests, want 2 pins (one per site)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := store.ActiveLeases(); n != 0 {
		t.Fatalf("%d leases still held after the gateway stopped, want 0", n)
	}
}
