package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
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

// TestATokenClientsTiersBoundWhereItsRequestsGo: a client whose line says
// tiers=residential starts every site there; one that says tiers=own never
// goes up, even when own has no usable member, and pinning residential is
// its 403 pool_forbidden, with nothing sent.
func TestATokenClientsTiersBoundWhereItsRequestsGo(t *testing.T) {
	ms := directMembers(2)
	ms[0].Attributes = map[string]string{"tier": "own"}
	ms[1].Attributes = map[string]string{"tier": "residential"}
	cs, err := clients.Parse(strings.NewReader("rich tok-r all tiers=residential\ncheap tok-c all tiers=own\nany tok-a all\n"))
	if err != nil {
		t.Fatal(err)
	}
	to := tiering.Options{Tiers: rotation.Tiers{"own", "residential"}, Rule: rotation.DefaultTierRule}
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true, Tiers: to, Clients: cs},
		pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Minute}}, ms...)
	site := testutil.StartTarget(t, testutil.TargetOptions{})
	for _, tc := range []struct{ name, token, tier, source string }{
		{"a residential client starts a fresh site on residential", "tok-r", "residential", sourceOf(ms[1])},
		{"an unbounded client starts it on the cheapest", "tok-a", "own", sourceOf(ms[0])},
		{"an own client starts it on own", "tok-c", "own", sourceOf(ms[0])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, a := get(t, e.client("crawler", tc.token), site.URL()+"/p", nil)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderTier) != tc.tier || a.Source != tc.source {
				t.Fatalf("%d from %s, tier %q; want 200 from %s on %s", resp.StatusCode, a.Source, resp.Header.Get(HeaderTier), tc.source, tc.tier)
			}
		})
	}
	t.Run("an own client pinning residential is refused", func(t *testing.T) {
		before := site.Total()
		req, err := http.NewRequest(http.MethodGet, site.URL()+"/pin", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Proxyfleet-Select", "tier=residential")
		resp, err := e.client("crawler", "tok-c").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := body(t, resp)
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderReason) != "pool_forbidden" || !strings.Contains(b, "client cheap may not lease tier residential") || site.Total() != before {
			t.Fatalf("%d %s %q (site saw %d more); want 403 pool_forbidden naming the client and the tier, nothing sent", resp.StatusCode, resp.Header.Get(HeaderReason), b, site.Total()-before)
		}
	})
	t.Run("an own client whose tier is banned stays on it", func(t *testing.T) {
		site.SetRule(sourceOf(ms[0]), http.StatusForbidden, nil)
		resp, a := get(t, e.client("crawler", "tok-c"), site.URL()+"/banned", nil)
		if resp.StatusCode != http.StatusForbidden || a.Source != sourceOf(ms[0]) {
			t.Fatalf("%d from %s; want the site's 403 through own, never residential", resp.StatusCode, a.Source)
		}
		resp, _ = get(t, e.client("crawler", "tok-c"), site.URL()+"/after", nil)
		if resp.StatusCode != http.StatusServiceUnavailable || site.Count(sourceOf(ms[1])) != 1 {
			t.Fatalf("%d, residential saw %d; want 503 (own rests) and residential used only by the residential client", resp.StatusCode, site.Count(sourceOf(ms[1])))
		}
	})
}

func TestTierOptionsReadAClientsTiers(t *testing.T) {
	o := tiering.Options{Tiers: rotation.Tiers{"own", "datacenter", "residential"}, Rule: rotation.DefaultTierRule}
	for _, tc := range []struct {
		name  string
		names []string
		want  rotation.TierRange
		err   string
	}{
		{"none is every tier", nil, rotation.TierRange{Lo: 0, Hi: 2}, ""},
		{"one tier", []string{"datacenter"}, rotation.TierRange{Lo: 1, Hi: 1}, ""},
		{"a run in any order", []string{"residential", "datacenter"}, rotation.TierRange{Lo: 1, Hi: 2}, ""},
		{"a gap", []string{"own", "residential"}, rotation.TierRange{}, "tiers=own,residential: not a run of --tiers own,datacenter,residential"},
		{"an unknown tier", []string{"mobile"}, rotation.TierRange{}, `tiers=mobile: "mobile" is not one of --tiers`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := o.Range(tc.names)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Range(%v) = %v, %v; want an error with %q", tc.names, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Range(%v) = %v, %v; want %v", tc.names, got, err, tc.want)
			}
		})
	}
	if _, err := (tiering.Options{}).Range([]string{"own"}); err == nil || !strings.Contains(err.Error(), "the gateway has no --tiers") {
		t.Fatalf("a client's tiers on a gateway of one tier: %v", err)
	}
	cs, err := clients.Parse(strings.NewReader("c tok all tiers=own,residential\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{}), Tiers: o, Clients: cs}); err == nil || !strings.Contains(err.Error(), "client c (line 1): tiers=own,residential: not a run") {
		t.Fatalf("a gateway given a client of a gap in its tiers: %v", err)
	}
}
