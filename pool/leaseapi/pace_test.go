package leaseapi_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The lease API carries the pace decisions: a gateway on --lease-api is
// paced by the server's store, with every other caller of that store.
func TestClientPacesThroughTheServersStore(t *testing.T) {
	const token = "tok"
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: token}, testMembers(t))
	var c pool.SitePacer = newTestClient(t, f, token)
	ctx := context.Background()
	req := pool.SlotRequest{Site: "a.example", Member: "a", MinInterval: 2 * time.Second, MaxWait: 10 * time.Second}
	if s, err := c.ReserveSlot(ctx, req); err != nil || !s.Reserved || s.Wait != 0 {
		t.Fatalf("first slot %+v, %v", s, err)
	}
	second, err := c.ReserveSlot(ctx, req)
	if err != nil || !second.Reserved || second.Wait != 2*time.Second || second.Interval != 2*time.Second {
		t.Fatalf("second slot %+v, %v, want one 2s later", second, err)
	}
	// The server's store holds it: another caller of it sees the slot taken.
	if s, _ := f.store.ReserveSlot(ctx, req); s.Wait != 4*time.Second {
		t.Fatalf("the store's own next slot %+v, want 4s away", s)
	}
	if err := c.ReturnSlot(ctx, req.Site, req.Member, second.Token); err != nil {
		t.Fatal(err)
	}
	if in, err := c.EnterSite(ctx, "a.example", "h1", 1); err != nil || !in {
		t.Fatalf("enter: %v %v", in, err)
	}
	if in, _ := c.EnterSite(ctx, "a.example", "h2", 1); in {
		t.Fatal("a second place at limit 1")
	}
	if err := c.LeaveSite(ctx, "a.example", "h1"); err != nil {
		t.Fatal(err)
	}
	if in, _ := c.EnterSite(ctx, "a.example", "h2", 1); !in {
		t.Fatal("the place given back was not free")
	}
	l, err := c.SiteAnswered(ctx, pool.SiteAnswer{Site: "b.example", Member: "a", Result: rotation.ResultBanned})
	if err != nil || l.Interval != rotation.PaceFirstCut || l.Cuts != 1 || l.Cause != rotation.ResultBanned {
		t.Fatalf("cut %+v, %v", l, err)
	}
	if got, err := c.SlowedSites(ctx); err != nil || !slices.Equal(got, []string{"b.example"}) {
		t.Fatalf("slowed %v, %v", got, err)
	}
	if s, _ := c.ReserveSlot(ctx, pool.SlotRequest{Site: "b.example", Member: "a", Auto: true}); s.Interval != rotation.PaceFirstCut || s.Learnt.Cuts != 1 {
		t.Fatalf("learnt slot %+v", s)
	}
	// The learning rule's first cut travels to the server's store and back.
	fc := rotation.Cut{Interval: 3 * time.Second, Pause: 4 * time.Second, Floor: 3 * time.Second, Steps: 7, Memory: time.Hour}
	if l, err := c.SiteAnswered(ctx, pool.SiteAnswer{Site: "c.example", Member: "a", Result: rotation.ResultRateLimited, FirstCut: fc}); err != nil ||
		l.Interval != fc.Interval || l.Pause != fc.Pause || l.Floor != fc.Floor || l.Steps != fc.Steps || l.Memory != fc.Memory {
		t.Fatalf("cut with the rule's %+v: %+v, %v", fc, l, err)
	}
	if s, _ := c.ReserveSlot(ctx, pool.SlotRequest{Site: "c.example", Member: "b", Auto: true, MaxWait: time.Minute}); !s.Reserved || s.Wait < 3*time.Second || s.Learnt.Pause != fc.Pause {
		t.Fatalf("slot after the rule's cut %+v, want one at the pause's end", s)
	}
}

func TestPaceRejectsBadInputNamingTheField(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: "tok"}, testMembers(t))
	for _, tc := range []struct{ body, want string }{
		{`{"op":"reserve","member":"a"}`, "site"},
		{`{"op":"reserve","site":"x"}`, "needs member"},
		{`{"op":"fly","site":"x"}`, "want reserve, return"},
		{`{"op":"bogus"}`, "want reserve, return"},
		{`{"op":"reserve","site":"bad host","member":"a"}`, "bad host"},
		{`{"op":"reserve","site":"https://x/","member":"a"}`, "is a URL"},
		{`{"op":"enter","site":"x"}`, "needs holder"},
		{`{"op":"reserve","site":"x","member":"a","minIntervalMillis":-1}`, "minIntervalMillis"},
		{`{"op":"enter","site":"x","holder":"h","limit":-2}`, "limit"},
		{`{"op":"answer","site":"x","member":"a","result":"meh"}`, "meh"},
		{`{"op":"reserve","site":"x","member":"a","extra":1}`, "extra"},
		{`{"op":"answer","site":"x","member":"a","result":"banned","firstCut":{"intervalNanos":-1}}`, "firstCut.intervalNanos"},
		{`{"op":"answer","site":"x","member":"a","result":"banned","firstCut":{"pauseNanos":99999999999999}}`, "firstCut.pauseNanos"},
		{`{"op":"answer","site":"x","member":"a","result":"banned","firstCut":{"steps":-3}}`, "firstCut.steps"},
		{`{"op":"answer","site":"x","member":"a","result":"banned","firstCut":{"memoryNanos":-1}}`, "firstCut.memoryNanos"},
	} {
		a := f.call(t, http.MethodPost, "/v1/pace", tc.body)
		if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.body, a.status, a.body, tc.want)
		}
	}
	if a := f.call(t, http.MethodPost, "/v1/pace", `{"op":"leave","site":"x","holder":"h"}`, "Authorization", "Bearer wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", a.status)
	}
	if a := f.call(t, http.MethodGet, "/v1/pace", ""); a.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/pace: %d", a.status)
	}
}
