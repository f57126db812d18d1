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
