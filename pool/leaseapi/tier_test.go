package leaseapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

var apiTierRule = rotation.TierRule{Threshold: 2, Window: time.Minute, Hold: time.Minute, ProbeEvery: 10 * time.Second}

// The lease API carries the tier decisions: a gateway on --lease-api starts
// a site where the server's store says, with every other caller of it.
func TestClientKeepsTiersInTheServersStore(t *testing.T) {
	const token = "tok"
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: token}, testMembers(t))
	var c pool.SiteTierKeeper = newTestClient(t, f, token)
	ctx := context.Background()
	all := rotation.TierRange{Lo: 0, Hi: 2}
	st, err := c.StartTier(ctx, "A.example", all, apiTierRule)
	if err != nil || st.Level != 0 || st.Probe || st.Moves != 0 {
		t.Fatalf("a new site starts at %+v, %v; want the cheapest tier", st, err)
	}
	for i := range 2 {
		p, err := c.TierAnswered(ctx, pool.TierAnswer{Site: "a.example", Level: 0, SeenMoves: st.Moves, Result: rotation.ResultBanned, Rule: apiTierRule, Top: 2})
		if err != nil || p.Level != i {
			t.Fatalf("after ban %d the site is at %+v, %v; want tier %d", i+1, p, err, i)
		}
	}
	// The server's store holds it: another caller of it starts there too.
	if got, _ := f.store.StartTier(ctx, "a.example", all, apiTierRule); got.Level != 1 || got.Moves != 1 {
		t.Fatalf("the store's own start %+v, want tier 1 after the climb", got)
	}
	f.clock.Step(time.Minute)
	probe, err := c.StartTier(ctx, "a.example", all, apiTierRule)
	if err != nil || !probe.Probe || probe.Level != 0 {
		t.Fatalf("after the hold %+v, %v; want a probe of tier 0", probe, err)
	}
	p, err := c.TierAnswered(ctx, pool.TierAnswer{Site: "a.example", Level: 0, SeenMoves: probe.Moves, Result: rotation.ResultOK, Rule: apiTierRule, Top: 2})
	if err != nil || p.Level != 0 || !p.Down || p.Moves != 2 {
		t.Fatalf("after the probe was served %+v, %v; want a step down to tier 0", p, err)
	}
}

func TestTierRefusesBadRequestsNamingTheField(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	rule := `"rule":{"threshold":3,"windowMillis":600000,"holdMillis":1800000,"probeEveryMillis":60000}`
	for _, tc := range []struct {
		name, body, want string
	}{
		{"an unknown op", `{"op":"climb","site":"a.example","top":2,` + rule + `}`, `op \"climb\": want start or answer`},
		{"no site", `{"op":"start","top":2,` + rule + `}`, "site must be a host"},
		{"one tier", `{"op":"start","site":"a.example","top":0,` + rule + `}`, "top 0 is out of range"},
		{"a range past the top", `{"op":"start","site":"a.example","lo":1,"hi":3,"top":2,` + rule + `}`, "lo 1 and hi 3 are not a range of tiers 0 to top 2"},
		{"an answer without a result", `{"op":"answer","site":"a.example","top":2,` + rule + `}`, "op answer needs result"},
		{"an unknown result", `{"op":"answer","site":"a.example","top":2,"result":"nope",` + rule + `}`, "invalid result"},
		{"a tier past the top", `{"op":"answer","site":"a.example","top":2,"level":5,"result":"banned",` + rule + `}`, "tier 5 is not one of 0 to 2"},
		{"a rule without bans", `{"op":"start","site":"a.example","top":2,"rule":{"threshold":0,"windowMillis":1,"holdMillis":1,"probeEveryMillis":1}}`, "rule: escalate bans 0 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := f.call(t, http.MethodPost, "/v1/tier", tc.body, "Content-Type", "application/json")
			if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), tc.want) {
				t.Fatalf("%d %s; want 400 with %q", a.status, a.body, tc.want)
			}
		})
	}
	if st, _ := f.store.StartTier(context.Background(), "a.example", rotation.TierRange{Hi: 2}, rotation.DefaultTierRule); st.Moves != 0 || st.Level != 0 {
		t.Fatalf("refused requests changed the site: %+v", st)
	}
	if a := f.call(t, http.MethodGet, "/v1/tier", ""); a.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/tier: %d, want 405", a.status)
	}
}
