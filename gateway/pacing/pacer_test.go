package pacing

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestSitePaceOverridesAndWildcards(t *testing.T) {
	sp, err := ParseSitePaces([]string{"*.example.com min-interval=2s max-concurrency=4", "api.example.com max-concurrency=1", "127.0.0.9 min-interval=0"},
		rotation.PaceLimits{MinInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]rotation.PaceLimits{
		"www.example.com": {MinInterval: 2 * time.Second, MaxConcurrency: 4},
		"api.example.com": {MinInterval: time.Second, MaxConcurrency: 1},
		"127.0.0.9":       {},
	} {
		if got, ok := sp.For(host); !ok || got != want {
			t.Errorf("For(%q) = %+v, %v; want %+v", host, got, ok, want)
		}
	}
	if _, ok := sp.For("example.org"); ok {
		t.Error("example.org matched")
	}
	for _, bad := range [][]string{{"example.com"}, {"example.com min-interval=fast"}, {"example.com max-concurrency=-1"},
		{"example.com rate=3"}, {"example.com min-interval=1s min-interval=2s"}, {"a.com min-interval=1s", "a.com max-concurrency=2"}, {"bad_host! min-interval=1s"}} {
		if _, err := ParseSitePaces(bad, rotation.PaceLimits{}); err == nil {
			t.Errorf("ParseSitePaces(%q) accepted", bad)
		}
	}
}

// BenchmarkPaceSiteWithoutLimits is what pacing adds to a request to a site
// without limits, with --pacing auto and no site slowed (the CLI's
// default): the pacing step before the attempt and the answer fed to the
// learnt pace after it.
//
//	go test -run x -bench BenchmarkPaceSiteWithoutLimits ./gateway/pacing/
func BenchmarkPaceSiteWithoutLimits(b *testing.B) {
	p := New(Options{Auto: true}, nil, nil)
	ctx := context.Background()
	var t Ticket
	a := Attempt{Site: "example.com"}
	for b.Loop() {
		if err := p.Pace(ctx, ctx, &t, a, Move{}); err != nil {
			b.Fatal(err)
		}
		p.Answered(&t, a.Site, a.Member, rotation.ResultOK)
	}
}

// BenchmarkPaceSiteWithoutLimitsLearning is BenchmarkPaceSiteWithoutLimits
// with the learning rule (rotation.DefaultPaceRule, the CLI's default): a
// plain request also trails the site's leader and logs its answer as the
// evidence a first ban is judged by.
//
//	go test -run x -bench BenchmarkPaceSiteWithoutLimitsLearning ./gateway/pacing/
func BenchmarkPaceSiteWithoutLimitsLearning(b *testing.B) {
	p := New(Options{Auto: true, Rule: rotation.DefaultPaceRule}, nil, nil)
	ctx := context.Background()
	t := Ticket{Trail: true}
	a := Attempt{Site: "example.com", Member: "m"}
	for b.Loop() {
		if err := p.Pace(ctx, ctx, &t, a, Move{}); err != nil {
			b.Fatal(err)
		}
		p.Answered(&t, a.Site, a.Member, rotation.ResultOK)
	}
}

func TestASiteSlowedElsewhereIsPacedAndSaysSo(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	p := New(Options{Auto: true}, store, nil)
	if p.paced(0) {
		t.Fatal("paced before any site was slowed")
	}
	p.applySlowed([]string{"slow.example"}, time.Now())
	if !p.paced(0) {
		t.Fatal("a site the fleet slowed does not take this gateway off its fast path")
	}
	st := p.Status()
	if len(st) != 1 || st[0].Site != "slow.example" || st[0].SlowedBy != slowedElsewhere {
		t.Fatalf("status %+v, want the site slowed by another gateway", st)
	}
	p.applySlowed(nil, time.Now())
	if p.paced(0) {
		t.Fatal("a slow-down the fleet ended still paces")
	}
}

func TestPacerViewPastMaxPaceSitesSweepsOncePerDoublingNotPerNewSite(t *testing.T) {
	p := New(Options{Auto: true}, pool.NewStore(pool.StoreOptions{}), nil)
	// The fleet slowed three times as many sites as the view's bound (a
	// broad crawl that met many 429s): none can be forgotten, and taking
	// them in must not sweep the whole view at every new one, under the
	// mutex every paced request takes.
	sites := make([]string, 3*maxPaceSites)
	for i := range sites {
		sites[i] = "s" + strconv.Itoa(i) + ".example"
	}
	p.applySlowed(sites, time.Now())
	if len(p.sites) != len(sites) || p.learnt.Load() != int64(len(sites)) {
		t.Fatalf("view of %d sites, %d slowed; want all %d", len(p.sites), p.learnt.Load(), len(sites))
	}
	if p.sweeps > 2 {
		t.Fatalf("%d sweeps for %d slowed sites, want one per doubling past %d", p.sweeps, len(sites), maxPaceSites)
	}
}

func TestPacerViewSweepForgettingADecayedSiteEndsItsSlowDownCount(t *testing.T) {
	p := New(Options{Auto: true}, pool.NewStore(pool.StoreOptions{}), nil)
	sites := make([]string, maxPaceSites)
	for i := range sites {
		sites[i] = "s" + strconv.Itoa(i) + ".example"
	}
	// Slowed long enough ago to have decayed; no request asked since.
	p.applySlowed(sites, time.Now().Add(-rotation.PaceQuiet-time.Second))
	p.mu.Lock()
	p.site("new.example") // past the bound: the sweep forgets them all
	p.mu.Unlock()
	if n := p.learnt.Load(); n != 0 || p.paced(0) {
		t.Fatalf("%d sites counted slowed after the sweep forgot every decayed one; want 0 and the fast path back", n)
	}
}

func TestABanIsJudgedByTheCutItsSlotWasPacedUnder(t *testing.T) {
	const site = "cuts.example"
	for _, tc := range []struct {
		name string
		view func(p *Pacer) // what this gateway knew before the request
	}{
		{"known only from the fleet's list of slowed sites", func(p *Pacer) { p.applySlowed([]string{site}, time.Now()) }},
		{"cut again elsewhere since this gateway's last request", func(p *Pacer) {
			p.mu.Lock()
			p.setLearnt(p.site(site), rotation.LearntPace{Interval: rotation.PaceFirstCut, CutInterval: rotation.PaceFirstCut, Cause: rotation.ResultBanned, CutAt: time.Now(), Cuts: 1})
			p.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			store := pool.NewPaces(nil)
			// Another gateway's requests cut the site (twice in the
			// second case) before this one's request is paced.
			cut, _ := store.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "m0", Result: rotation.ResultBanned})
			if strings.Contains(tc.name, "again") {
				cut, _ = store.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "m9", Result: rotation.ResultBanned, SeenCuts: 1})
			}
			// The store as one in another process is (a Redis, a lease API).
			p := New(Options{Auto: true}, &struct{ *pool.Paces }{store}, nil)
			defer p.Close()
			tc.view(p)
			var tk Ticket
			a := Attempt{Site: site, Member: "m1"}
			if err := p.Pace(ctx, ctx, &tk, a, Move{}); err != nil {
				t.Fatal(err)
			}
			// The request went out under the store's pace: a ban to it,
			// through a member never banned, is news and doubles it.
			p.Answered(&tk, a.Site, a.Member, rotation.ResultBanned)
			l, _ := store.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultOK})
			if l.Cuts != cut.Cuts+1 {
				t.Fatalf("after a ban to a request paced under cut %d: %d cuts (%v), want %d", cut.Cuts, l.Cuts, l, cut.Cuts+1)
			}
		})
	}
}

func TestASiteTheFleetStillSlowsStaysPacedPastTheQuietPeriodOfItsFirstListing(t *testing.T) {
	p := New(Options{Auto: true}, &struct{ *pool.Paces }{pool.NewPaces(nil)}, nil)
	defer p.Close()
	const site = "still.example"
	for _, tc := range []struct {
		name   string
		listed time.Time // when the view took the site in
	}{
		{"listed just now", time.Now()},
		{"listed a quiet period ago, cut again by the fleet since", time.Now().Add(-rotation.PaceQuiet - time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.applySlowed(nil, time.Now())
			p.applySlowed([]string{site}, tc.listed)
			// The store still lists it at this second's refresh.
			p.applySlowed([]string{site}, time.Now())
			p.mu.Lock()
			l := p.learntFor(p.sites[site], time.Now())
			p.mu.Unlock()
			if !l.Slowed() || !p.paced(0) {
				t.Fatalf("view %+v: a site the store lists as slowed goes out unpaced", l)
			}
		})
	}
}

func TestAViewOfTheFleetsPaceDoesNotDecayByThisGatewaysClock(t *testing.T) {
	const site = "skew.example"
	for _, tc := range []struct {
		name string
		skew time.Duration // how far the store's clock is behind this gateway's
	}{
		{"clocks agree", 0},
		{"the store's clock a quiet period behind", rotation.PaceQuiet + time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := pool.NewPaces(testingclock.NewFakeClock(time.Now().Add(-tc.skew)))
			p := New(Options{Auto: true}, &struct{ *pool.Paces }{store}, nil)
			defer p.Close()
			p.Answered(&Ticket{}, site, "m1", rotation.ResultRateLimited)
			if l, _ := store.SiteAnswered(context.Background(), pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultOK}); !l.Slowed() {
				t.Fatalf("the store did not slow the site: %+v", l)
			}
			// The store slows the site; the view must not call it over
			// because its cut time, on the store's clock, reads as long ago
			// on this one's: the next request would go out unpaced.
			p.mu.Lock()
			l := p.learntFor(p.sites[site], time.Now())
			p.mu.Unlock()
			if !l.Slowed() || !p.paced(0) {
				t.Fatalf("view %+v: the site the store slows goes out unpaced", l)
			}
		})
	}
}

func TestClientPaceIsNeverLooserThanTheOperators(t *testing.T) {
	// Without an operator's pace the client's own holds; a looser one
	// than the operator's changes nothing.
	if lim, src := New(Options{}, nil, nil).o.explicitFor("x", time.Millisecond); lim.MinInterval != time.Millisecond || src != "the client's pace" {
		t.Fatalf("client pace alone: %v %s", lim.MinInterval, src)
	}
	p := New(Options{Default: rotation.PaceLimits{MinInterval: time.Second}}, nil, nil)
	if lim, src := p.o.explicitFor("x", time.Millisecond); lim.MinInterval != time.Second || src != "--site-min-interval" {
		t.Fatalf("a looser client pace won: %v %s", lim.MinInterval, src)
	}
}

func TestARequestLeasedOnAMemberTheSiteBannedMovesOffItBeforeWaiting(t *testing.T) {
	const site = "moved.example"
	for _, tc := range []struct {
		name   string
		member string // the request's lease
		offer  string // what the leasing stage offers (Move.Other)
		want   string // the member the request goes through
		after  bool   // the request began after the ban
	}{
		{"leased on the banned member, another offered: it moves", "m1", "m2", "m2", false},
		{"leased on the banned member, none offered: it stays", "m1", "", "m1", false},
		{"leased on a member not banned: it stays", "m3", "m2", "m3", false},
		{"a request that began after the ban stays: the pool leased it the member once its cooldown ended", "m1", "m2", "m1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			store := pool.NewPaces(nil)
			p := New(Options{Auto: true}, store, nil)
			// The request began before the ban (its first attempt came to
			// the pacer), unless the case says otherwise.
			tk := Ticket{began: time.Now().Add(-time.Second)}
			// m1 sent first and was refused: the site is slowed and m1
			// banned by it.
			p.Answered(&Ticket{}, site, "m1", rotation.ResultRateLimited)
			// m1 took its first slot after the cut already (a request
			// leased on it before the ban went out), m2 two: the banned
			// member's next slot comes sooner than the other's, and is
			// worth nothing. m3 has none, so a request on it goes at once.
			for _, m := range []string{"m1", "m2", "m2"} {
				if _, err := store.ReserveSlot(ctx, pool.SlotRequest{Site: site, Member: m, Auto: true, MaxWait: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			went := tc.member
			offered := false
			mv := Move{
				Other: func(context.Context) string { offered = true; return tc.offer },
				Settle: func(_ context.Context, keepOther bool) {
					if keepOther {
						went = tc.offer
					}
				},
			}
			if tc.after {
				tk = Ticket{}
			}
			if err := p.Pace(ctx, ctx, &tk, Attempt{Site: site, Member: tc.member}, mv); err != nil {
				t.Fatal(err)
			}
			if went != tc.want || (tc.member == "m3" && offered) {
				t.Fatalf("the request went through %s (offered another: %v), want %s", went, offered, tc.want)
			}
		})
	}
}

func TestAFirstCutSkipsThePauseOnlyWhereThisGatewaySawEverySend(t *testing.T) {
	const site = "alone.example"
	rule := rotation.PaceRule{Window: 10 * time.Second, IncreaseSteps: 50}
	for _, tc := range []struct {
		name      string
		shared    bool // the store is another process's (Redis, a lease API)
		wantPause time.Duration
	}{
		{"its own store: the others sent nothing, no pause", false, 0},
		{"a shared store: another gateway may have sent through them, the full pause", true, 11 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			store := pool.NewPaces(nil)
			var sp pool.SitePacer = store
			if tc.shared {
				sp = &struct{ *pool.Paces }{store}
			}
			p := New(Options{Auto: true, Rule: rule}, sp, nil)
			defer p.Close()
			// The leader is served twice; the others trail it and send
			// nothing before its third request is refused.
			for range 2 {
				tk := Ticket{Trail: true}
				if err := p.Pace(ctx, ctx, &tk, Attempt{Site: site, Member: "lead"}, Move{}); err != nil {
					t.Fatal(err)
				}
				p.Answered(&tk, site, "lead", rotation.ResultOK)
			}
			tk := Ticket{Trail: true}
			if err := p.Pace(ctx, ctx, &tk, Attempt{Site: site, Member: "lead"}, Move{}); err != nil {
				t.Fatal(err)
			}
			p.Answered(&tk, site, "lead", rotation.ResultRateLimited)
			l, _ := store.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "other", Result: rotation.ResultOK})
			if l.Pause != tc.wantPause || l.Interval != 5500*time.Millisecond {
				t.Fatalf("cut %v (pause %v, interval %v), want a pause of %v and 2 per 11s", l, l.Pause, l.Interval, tc.wantPause)
			}
		})
	}
}
