package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestASiteThatBansTheCheapTierClimbsAloneAndStepsDownWhenItForgives runs
// the tier stage through real Squids: two of tier own, one of tier
// residential, each with its own source address. Site A bans the own
// addresses; site B bans nothing. A's first request is banned on both own
// members, climbs (two bans), and is served on residential in the same
// request; A's next requests start there, though the own members rest no
// more; B stays on own. Past the hold a probe of own is banned and goes on
// on residential. Once A forgives and the hold is over, a probe is served
// on own and A steps down.
func TestASiteThatBansTheCheapTierClimbsAloneAndStepsDownWhenItForgives(t *testing.T) {
	squids := squid.StartAll(t,
		squid.Options{Name: "own-1", OutgoingAddr: "127.0.0.61"},
		squid.Options{Name: "own-2", OutgoingAddr: "127.0.0.62"},
		squid.Options{Name: "res-1", OutgoingAddr: "127.0.0.63"},
	)
	tiers := []string{"own", "own", "residential"}
	var members []pool.Member
	for i, s := range squids {
		u, err := url.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, pool.Member{Name: s.Name(), URL: u, Attributes: map[string]string{"tier": tiers[i]}})
	}
	// Cooldowns of a second, a hold of 8: once the banned members rest no
	// more, only the learnt tier keeps A's requests off them.
	const hold = 8 * time.Second
	to := tiering.Options{Tiers: rotation.Tiers{"own", "residential"},
		Rule: rotation.TierRule{Threshold: 2, Window: time.Minute, Hold: hold, ProbeEvery: time.Second}}
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true, Tiers: to},
		pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Second, Max: time.Second}}, members...)
	siteA := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.64"})
	siteB := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.65"})
	siteA.SetRule("127.0.0.61", http.StatusForbidden, nil)
	siteA.SetRule("127.0.0.62", http.StatusForbidden, nil)
	c := e.client("", "")

	resp, a := get(t, c, siteA.URL()+"/first", nil)
	climbed := time.Now()
	if resp.StatusCode != 200 || a.Source != "127.0.0.63" || resp.Header.Get(HeaderTier) != "residential" || resp.Header.Get(HeaderAttempts) != "3" {
		t.Fatalf("A's first request: %d from %s, tier %q, %s attempts; want 200 from the residential member after two bans on own",
			resp.StatusCode, a.Source, resp.Header.Get(HeaderTier), resp.Header.Get(HeaderAttempts))
	}
	time.Sleep(1500 * time.Millisecond) // the own members' cooldowns end
	for i := range 3 {
		resp, a := get(t, c, siteA.URL()+"/next", nil)
		if time.Since(climbed) >= hold {
			t.Logf("request %d came %v after the climb, past the hold: not judged (a very slow machine)", i+2, time.Since(climbed))
			break
		}
		if resp.StatusCode != 200 || a.Source != "127.0.0.63" || resp.Header.Get(HeaderTier) != "residential" || resp.Header.Get(HeaderAttempts) != "1" {
			t.Fatalf("A's request %d after the climb: %d from %s, tier %q, %s attempts; want 200 on residential at once",
				i+2, resp.StatusCode, a.Source, resp.Header.Get(HeaderTier), resp.Header.Get(HeaderAttempts))
		}
	}
	for i := range 4 {
		resp, a := get(t, c, siteB.URL()+"/b", nil)
		if resp.StatusCode != 200 || !strings.HasPrefix(a.Source, "127.0.0.6") || a.Source == "127.0.0.63" || resp.Header.Get(HeaderTier) != "own" {
			t.Fatalf("B's request %d: %d from %s, tier %q; want 200 on own", i+1, resp.StatusCode, a.Source, resp.Header.Get(HeaderTier))
		}
	}
	if n := siteA.Count("127.0.0.61") + siteA.Count("127.0.0.62"); n != 2 && time.Since(climbed) < hold {
		t.Fatalf("site A saw %d requests from own members within the hold, want the 2 it banned", n)
	}

	// Past the hold, A still banning: a probe goes to own, is banned and
	// is served on residential in the same request; one banned request
	// more for A's own members, no more.
	ownBefore := siteA.Count("127.0.0.61") + siteA.Count("127.0.0.62")
	probeDeadline := time.Now().Add(hold + 60*time.Second)
	for {
		resp, a := get(t, c, siteA.URL()+"/probe", nil)
		if resp.StatusCode != 200 || a.Source != "127.0.0.63" || resp.Header.Get(HeaderTier) != "residential" {
			t.Fatalf("A's request past the hold: %d from %s, tier %q; want every one served on residential", resp.StatusCode, a.Source, resp.Header.Get(HeaderTier))
		}
		if resp.Header.Get(HeaderAttempts) == "2" {
			break
		}
		if time.Now().After(probeDeadline) {
			t.Fatalf("no probe of own within %v of the climb (hold %v)", hold+60*time.Second, hold)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := siteA.Count("127.0.0.61") + siteA.Count("127.0.0.62"); n != ownBefore+1 {
		t.Fatalf("a banned probe cost A's own members %d requests, want 1 (it goes on on residential)", n-ownBefore)
	}

	// A forgives. Every request is served meanwhile; the next probe, once
	// the hold (restarted by the banned one) is over, steps A down.
	siteA.ClearRule("127.0.0.61")
	siteA.ClearRule("127.0.0.62")
	deadline := time.Now().Add(hold + 60*time.Second)
	for {
		resp, a := get(t, c, siteA.URL()+"/later", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("A's request while stepping down: %d, want every one served", resp.StatusCode)
		}
		if resp.Header.Get(HeaderTier) == "own" && a.Source != "127.0.0.63" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A never stepped down to own within %v of forgiving (hold %v)", hold+60*time.Second, hold)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for range 3 {
		if resp, a := get(t, c, siteA.URL()+"/down", nil); resp.StatusCode != 200 || resp.Header.Get(HeaderTier) != "own" || a.Source == "127.0.0.63" {
			t.Fatalf("A after stepping down: %d from %s, tier %q; want own", resp.StatusCode, a.Source, resp.Header.Get(HeaderTier))
		}
	}
}

// TestAClientPinsATierWithItsSelector: tier=NAME is an attribute selector
// like any other, and the gateway's answer names the tier.
func TestAClientPinsATierWithItsSelector(t *testing.T) {
	ms := directMembers(2)
	ms[0].Attributes = map[string]string{"tier": "own"}
	ms[1].Attributes = map[string]string{"tier": "residential"}
	to := tiering.Options{Tiers: rotation.Tiers{"own", "residential"}, Rule: rotation.DefaultTierRule}
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true, Tiers: to}, pool.StoreOptions{}, ms...)
	site := testutil.StartTarget(t, testutil.TargetOptions{})
	for _, tc := range []struct {
		name, sel, wantTier, wantSource string
	}{
		{"no pin starts on the cheapest", "", "own", sourceOf(ms[0])},
		{"a pin on residential", "tier=residential", "residential", sourceOf(ms[1])},
		{"a pin on own", "tier=own", "own", sourceOf(ms[0])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			if tc.sel != "" {
				hdr.Set("X-Proxyfleet-Select", tc.sel)
			}
			resp, a := get(t, e.client("", ""), site.URL()+"/p", hdr)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderTier) != tc.wantTier || a.Source != tc.wantSource {
				t.Fatalf("%d from %s, tier %q; want 200 from %s on %s", resp.StatusCode, a.Source, resp.Header.Get(HeaderTier), tc.wantSource, tc.wantTier)
			}
		})
	}
	t.Run("a tier the gateway does not have matches nothing", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, site.URL()+"/p", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Proxyfleet-Select", "tier=mobile")
		resp, err := e.client("", "").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := body(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "tier=mobile") {
			t.Fatalf("%d %q; want 503 naming tier=mobile", resp.StatusCode, b)
		}
	})
}

func TestTierOptionsGiveMembersTheirTier(t *testing.T) {
	o := tiering.Options{Tiers: rotation.Tiers{"own", "residential"}, Rule: rotation.DefaultTierRule}
	ms := []pool.Member{{Name: "a"}, {Name: "b", Attributes: map[string]string{"tier": "residential", "region": "eu"}}}
	got, err := o.Members(ms)
	if err != nil || got[0].Attributes["tier"] != "own" || got[1].Attributes["tier"] != "residential" || got[1].Attributes["region"] != "eu" || ms[0].Attributes != nil {
		t.Fatalf("Members = %+v, %v; want a on own (its own map untouched), b as it was", got, err)
	}
	if _, err := o.Members([]pool.Member{{Name: "c", Attributes: map[string]string{"tier": "mobile"}}}); err == nil || !strings.Contains(err.Error(), `member c: tier "mobile" is not one of --tiers own,residential`) {
		t.Fatalf("a member of an unknown tier: %v", err)
	}
	if got, err := (tiering.Options{}).Members(ms); err != nil || got[0].Attributes != nil {
		t.Fatalf("one tier: members changed to %+v, %v", got, err)
	}
}
