package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// lostReports is a pool whose failure reports never arrive, as when a
// remote lease API's Report call is lost: it keeps offering a failed member.
type lostReports struct{ *pool.Store }

func (lostReports) Report(context.Context, string, pool.Report) error { return nil }

func TestConnectReofferedAFailedMemberLeavesNoPin(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{deadUpstream(t)})
	g, err := New(Options{Pool: lostReports{store}, Mode: rotation.ModeSticky, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveGateway(t, g)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})

	_, resp, err := testutil.ConnectTunnel(addr, tg.Addr(), nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	// The session ("" without credentials) must not stay pinned to the
	// member that just failed: its next tunnel asks the pool again.
	if pin, ok := g.leases.aff.Get("", rotation.TargetKey(tg.Addr())); ok {
		t.Fatalf("the session is still pinned to %s (lease %s)", pin.Member, pin.LeaseID)
	}
	if n := store.ActiveLeases(); n != 0 {
		t.Fatalf("%d leases still active, want 0", n)
	}
}
