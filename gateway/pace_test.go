package gateway

import (
	"context"
	"errors"
	testingclock "k8s.io/utils/clock/testing"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func paceOptions(p PacingOptions) Options {
	return Options{AllowPrivateTargets: true, Pacing: p}
}

func TestMinIntervalSpacesRequestsPerMemberAndNeverDelaysAnotherSite(t *testing.T) {
	const iv = 300 * time.Millisecond
	e := newEnv(t, paceOptions(PacingOptions{Default: rotation.PaceLimits{MinInterval: iv}}), pool.StoreOptions{}, directMembers(1)...)
	paced := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.171"})
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.172"})
	c := e.client("", "")
	start := time.Now()
	for range 4 {
		if resp, _ := get(t, c, paced.URL(), nil); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if d := time.Since(start); d < 3*iv-20*time.Millisecond {
		t.Fatalf("4 requests through one member took %v, want at least 3 intervals (%v)", d, 3*iv)
	}
	// The other site has its own slots: a request to it while the first
	// site's next slot is far off goes at once.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); get(t, c, paced.URL(), nil) }()
	time.Sleep(20 * time.Millisecond)
	t0 := time.Now()
	if resp, _ := get(t, c, other.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("other site: status %d", resp.StatusCode)
	}
	if d := time.Since(t0); d > iv/2 {
		t.Errorf("the other site's request took %v while the paced site waited", d)
	}
	wg.Wait()
}

// getText is a GET through c with its answer's body as text.
func getText(t *testing.T, c *http.Client, u string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return resp, body(t, resp)
}

func mustSitePaces(t *testing.T, entries ...string) SitePaces {
	t.Helper()
	sp, err := ParseSitePaces(entries, rotation.PaceLimits{})
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

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

func TestPacedAfterMaxWaitIs503WithRetryAfterAndTheLimit(t *testing.T) {
	e := newEnv(t, paceOptions(PacingOptions{Sites: mustSitePaces(t, "127.0.0.173 min-interval=3s"), MaxWait: 100 * time.Millisecond}),
		pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.173"})
	c := e.client("", "")
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first: status %d", resp.StatusCode)
	}
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != ReasonPaced {
		t.Fatalf("second: %d %q %s, want 503 paced", resp.StatusCode, resp.Header.Get(HeaderReason), b)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "3" && ra != "2" {
		t.Errorf("Retry-After %q, want the next slot (3s)", ra)
	}
	if !strings.Contains(b, "one request per 3s per member (--site-pace)") {
		t.Errorf("body %q does not name the limit", b)
	}
	if n := tg.Count(sourceOf(directMembers(1)[0])); n != 1 {
		t.Errorf("the site saw %d requests, want 1", n)
	}
	st := e.gw.PaceStatus()
	if len(st) != 1 || st[0].Site != "127.0.0.173" || st[0].Refused != 1 || st[0].MinIntervalMillis != 3000 || !strings.Contains(st[0].Limit, "--site-pace") {
		t.Errorf("PaceStatus %+v, want the site with one refusal and its 3s limit", st)
	}
}

func TestMaxConcurrencyQueuesAndAClientThatLeavesFreesItsPlace(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	inflight, most := 0, 0
	site := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inflight++
		most = max(most, inflight)
		mu.Unlock()
		if r.URL.Path == "/hold" {
			<-release
		}
		mu.Lock()
		inflight--
		mu.Unlock()
	}))
	e := newEnv(t, paceOptions(PacingOptions{Default: rotation.PaceLimits{MaxConcurrency: 1}, MaxWait: 20 * time.Second}), pool.StoreOptions{}, directMembers(2)...)
	c := e.client("", "")
	held := make(chan int, 1)
	go func() { resp, _ := get(t, c, site+"/hold", nil); held <- resp.StatusCode }()
	poll.Until(t, 10*time.Second, "the held request in flight", func() error {
		mu.Lock()
		defer mu.Unlock()
		if inflight != 1 {
			return context.DeadlineExceeded
		}
		return nil
	})
	// A second request waits; its client gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, site+"/gone", nil)
	if _, err := c.Do(req); err == nil {
		t.Fatal("the waiting request was answered while the only place was held")
	}
	cancel()
	close(release)
	if s := <-held; s != 200 {
		t.Fatalf("held: %d", s)
	}
	// The place is free again for the next request, which is not behind
	// the one that left.
	start := time.Now()
	if resp, _ := get(t, c, site+"/next", nil); resp.StatusCode != 200 {
		t.Fatalf("next: %d", resp.StatusCode)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("next took %v", d)
	}
	if most != 1 {
		t.Fatalf("%d requests were in flight at once, want 1", most)
	}
}

func TestWaitingRequestTakesAnotherMemberThatIsFreeSooner(t *testing.T) {
	e := newEnv(t, paceOptions(PacingOptions{Default: rotation.PaceLimits{MinInterval: 10 * time.Second}, MaxWait: 100 * time.Millisecond}),
		pool.StoreOptions{}, directMembers(2)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.174"})
	c := e.client("", "")
	seen := map[string]bool{}
	for range 2 {
		resp, a := get(t, c, tg.URL(), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get(HeaderReason))
		}
		seen[a.Source] = true
	}
	if len(seen) != 2 {
		t.Fatalf("sources %v, want both members (the second was free sooner)", seen)
	}
	// A strict session stays on its member and is paced instead.
	tg2 := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.177"})
	resp, _ := get(t, c, tg2.URL(), http.Header{HeaderStrict: {"1"}, HeaderSession: {"s"}})
	if resp.StatusCode != 200 {
		t.Fatalf("strict first: %d", resp.StatusCode)
	}
	resp, _ = get(t, c, tg2.URL(), http.Header{HeaderStrict: {"1"}, HeaderSession: {"s"}})
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != ReasonPaced {
		t.Fatalf("strict second: %d %q, want paced on its own member", resp.StatusCode, resp.Header.Get(HeaderReason))
	}
}

func TestClientPaceIsNeverLooserThanTheOperators(t *testing.T) {
	e := newEnv(t, paceOptions(PacingOptions{MaxWait: 50 * time.Millisecond}), pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.175"})
	c := e.client("crawler-pace-5s", "")
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != 503 || !strings.Contains(b, "the client's pace") {
		t.Fatalf("second: %d %s, want paced by the client's pace", resp.StatusCode, b)
	}
	// Another client without a pace is not held by it... but by the
	// member's slot the first one took; a looser pace than the operator's
	// changes nothing.
	if lim, _ := e.gw.pacer.explicitFor("x", time.Millisecond); lim.MinInterval != time.Millisecond {
		t.Fatalf("client pace %v", lim.MinInterval)
	}
	g2 := newPacer(PacingOptions{Default: rotation.PaceLimits{MinInterval: time.Second}}, nil, nil, nil)
	if lim, src := g2.explicitFor("x", time.Millisecond); lim.MinInterval != time.Second || src != "--site-min-interval" {
		t.Fatalf("a looser client pace won: %v %s", lim.MinInterval, src)
	}
}

func TestAutoPacingCutsTheSiteAtItsFirstBan(t *testing.T) {
	members := directMembers(2)
	for _, auto := range []bool{true, false} {
		e := newEnv(t, paceOptions(PacingOptions{Auto: auto}), pool.StoreOptions{}, members...)
		tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.176"})
		tg.SetRule(sourceOf(members[0]), http.StatusTooManyRequests, nil)
		c := e.client("", "")
		// The first request meets the limited member or not; run until it has.
		for range 3 {
			get(t, c, tg.URL(), nil)
		}
		start := time.Now()
		for range 3 {
			if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
				t.Fatalf("auto=%v: %d", auto, resp.StatusCode)
			}
		}
		d := time.Since(start)
		switch {
		case auto && d < 2*rotation.PaceFirstCut-50*time.Millisecond:
			t.Errorf("auto: 3 requests through the one member left took %v, want the learnt pace (%v each)", d, rotation.PaceFirstCut)
		case !auto && d > time.Second:
			t.Errorf("off: 3 requests took %v, want no pace", d)
		}
		if auto {
			e.gw.pacer.mu.Lock()
			l := e.gw.pacer.sites["127.0.0.176"].learnt
			e.gw.pacer.mu.Unlock()
			if l.Cause != rotation.ResultRateLimited || l.Cuts != 1 {
				t.Errorf("learnt %+v, want one cut by rate_limited", l)
			}
		}
	}
}

// BenchmarkPaceSiteWithoutLimits is what pacing adds to a request to a site
// without limits, with --pacing auto and no site slowed (the CLI's
// default): the pacing step before the attempt and the answer fed to the
// learnt pace after it.
//
//	go test -run x -bench BenchmarkPaceSiteWithoutLimits ./gateway/
func BenchmarkPaceSiteWithoutLimits(b *testing.B) {
	g := &Gateway{pacer: newPacer(PacingOptions{Auto: true}, nil, nil, nil)}
	ctx := context.Background()
	rq := &request{lr: leaseReq{p: &params.Params{}, target: "example.com"}}
	for b.Loop() {
		if _, err := g.pacer.pace(ctx, ctx, rq, nil, held{}); err != nil {
			b.Fatal(err)
		}
		g.pacer.answered(rq, rotation.ResultOK)
	}
}

// BenchmarkPaceSiteWithoutLimitsLearning is BenchmarkPaceSiteWithoutLimits
// with the learning rule (rotation.DefaultPaceRule, the CLI's default): a
// plain request also trails the site's leader and logs its answer as the
// evidence a first ban is judged by.
//
//	go test -run x -bench BenchmarkPaceSiteWithoutLimitsLearning ./gateway/
func BenchmarkPaceSiteWithoutLimitsLearning(b *testing.B) {
	g := &Gateway{pacer: newPacer(PacingOptions{Auto: true, Rule: rotation.DefaultPaceRule}, nil, nil, nil)}
	ctx := context.Background()
	rq := &request{lr: leaseReq{p: &params.Params{}, target: "example.com"}, member: "m", pace: paceTicket{trail: true}}
	h := held{mc: &memberConn{m: pool.Member{Name: "m"}}}
	for b.Loop() {
		if _, err := g.pacer.pace(ctx, ctx, rq, nil, h); err != nil {
			b.Fatal(err)
		}
		g.pacer.answered(rq, rotation.ResultOK)
	}
}

func TestASiteSlowedElsewhereIsPacedAndSaysSo(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	p := newPacer(PacingOptions{Auto: true}, store, nil, nil)
	if p.paced(0) {
		t.Fatal("paced before any site was slowed")
	}
	p.applySlowed([]string{"slow.example"}, time.Now())
	if !p.paced(0) {
		t.Fatal("a site the fleet slowed does not take this gateway off its fast path")
	}
	g := &Gateway{pacer: p}
	st := g.PaceStatus()
	if len(st) != 1 || st[0].Site != "slow.example" || st[0].SlowedBy != slowedElsewhere {
		t.Fatalf("status %+v, want the site slowed by another gateway", st)
	}
	p.applySlowed(nil, time.Now())
	if p.paced(0) {
		t.Fatal("a slow-down the fleet ended still paces")
	}
}

// lostReplyPacer is a store whose EnterSite takes the place and then
// fails, as a call whose answer is lost (a connection cut after the
// script ran, the request's context ended mid-call) does.
type lostReplyPacer struct {
	*pool.Paces
	mu   sync.Mutex
	lose int // EnterSite calls still to fail after taking the place
}

func (s *lostReplyPacer) EnterSite(ctx context.Context, site, holder string, limit int) (bool, error) {
	in, err := s.Paces.EnterSite(ctx, site, holder, limit)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.lose > 0 {
		s.lose--
		return false, errors.New("connection reset by peer")
	}
	return in, err
}

func TestAPlaceInFlightWhoseStoreCallFailedIsGivenBackToTheStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose int
	}{
		{"the store's first answer lost", 1},
		{"every answer lost (the gateway paces alone)", 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &lostReplyPacer{Paces: pool.NewPaces(nil), lose: tc.lose}
			o := paceOptions(PacingOptions{Default: rotation.PaceLimits{MaxConcurrency: 1}, MaxWait: 2 * time.Second})
			o.Pacer = store
			e := newEnv(t, o, pool.StoreOptions{}, directMembers(1)...)
			tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.181"})
			if resp, _ := get(t, e.client("", ""), tg.URL(), nil); resp.StatusCode != 200 {
				t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get(HeaderReason))
			}
			store.mu.Lock()
			store.lose = 0
			store.mu.Unlock()
			// The request is over: the site's only place is free in the
			// store again, not held for pool.PaceHold by the place the
			// failed call took.
			poll.Until(t, 10*time.Second, "the site's place free in the store", func() error {
				in, err := store.Paces.EnterSite(context.Background(), "127.0.0.181", "probe", 1)
				if err != nil {
					return err
				}
				if !in {
					return errors.New("the site's place is still held")
				}
				return store.Paces.LeaveSite(context.Background(), "127.0.0.181", "probe")
			})
		})
	}
}

func TestPacerViewPastMaxPaceSitesSweepsOncePerDoublingNotPerNewSite(t *testing.T) {
	p := newPacer(PacingOptions{Auto: true}, pool.NewStore(pool.StoreOptions{}), nil, nil)
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
	p := newPacer(PacingOptions{Auto: true}, pool.NewStore(pool.StoreOptions{}), nil, nil)
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

func TestASlotPastTheRequestTimeoutIsPacedAtOnceNotATimeout(t *testing.T) {
	o := paceOptions(PacingOptions{Sites: mustSitePaces(t, "127.0.0.182 min-interval=3s"), MaxWait: 10 * time.Second})
	o.RequestTimeout = time.Second
	e := newEnv(t, o, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.182"})
	c := e.client("", "")
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first: status %d", resp.StatusCode)
	}
	// The next slot is 3s away: within --pacing-max-wait, past the
	// request's own deadline. Waiting for it could only end in a 504.
	start := time.Now()
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != ReasonPaced {
		t.Fatalf("second: %d %q %s, want 503 paced", resp.StatusCode, resp.Header.Get(HeaderReason), b)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Errorf("the refusal took %v, want it at once", d)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "3" && ra != "2" {
		t.Errorf("Retry-After %q, want the next slot (3s)", ra)
	}
	if !strings.Contains(b, "--request-timeout") {
		t.Errorf("body %q does not say the request's deadline held it", b)
	}
}

func TestABanIsJudgedByTheCutItsSlotWasPacedUnder(t *testing.T) {
	const site = "cuts.example"
	for _, tc := range []struct {
		name string
		view func(p *pacer) // what this gateway knew before the request
	}{
		{"known only from the fleet's list of slowed sites", func(p *pacer) { p.applySlowed([]string{site}, time.Now()) }},
		{"cut again elsewhere since this gateway's last request", func(p *pacer) {
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
			p := newPacer(PacingOptions{Auto: true}, &struct{ *pool.Paces }{store}, nil, nil)
			defer p.close()
			tc.view(p)
			g := &Gateway{pacer: p}
			rq := &request{lr: leaseReq{p: &params.Params{}, target: site}, member: "m1"}
			h := held{mc: &memberConn{m: pool.Member{Name: "m1"}}}
			if _, err := g.pacer.pace(ctx, ctx, rq, &attempts{}, h); err != nil {
				t.Fatal(err)
			}
			// The request went out under the store's pace: a ban to it,
			// through a member never banned, is news and doubles it.
			g.pacer.answered(rq, rotation.ResultBanned)
			l, _ := store.SiteAnswered(ctx, pool.SiteAnswer{Site: site, Member: "m1", Result: rotation.ResultOK})
			if l.Cuts != cut.Cuts+1 {
				t.Fatalf("after a ban to a request paced under cut %d: %d cuts (%v), want %d", cut.Cuts, l.Cuts, l, cut.Cuts+1)
			}
		})
	}
}

func TestASiteTheFleetStillSlowsStaysPacedPastTheQuietPeriodOfItsFirstListing(t *testing.T) {
	p := newPacer(PacingOptions{Auto: true}, &struct{ *pool.Paces }{pool.NewPaces(nil)}, nil, nil)
	defer p.close()
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
			p := newPacer(PacingOptions{Auto: true}, &struct{ *pool.Paces }{store}, nil, nil)
			defer p.close()
			g := &Gateway{pacer: p}
			rq := &request{lr: leaseReq{p: &params.Params{}, target: site}, member: "m1"}
			g.pacer.answered(rq, rotation.ResultRateLimited)
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
