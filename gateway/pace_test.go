package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func paceOptions(p pacing.Options) Options {
	return Options{AllowPrivateTargets: true, Pacing: p}
}

func TestMinIntervalSpacesRequestsPerMemberAndNeverDelaysAnotherSite(t *testing.T) {
	const iv = 300 * time.Millisecond
	e := newEnv(t, paceOptions(pacing.Options{Default: rotation.PaceLimits{MinInterval: iv}}), pool.StoreOptions{}, directMembers(1)...)
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

func mustSitePaces(t *testing.T, entries ...string) pacing.SitePaces {
	t.Helper()
	sp, err := pacing.ParseSitePaces(entries, rotation.PaceLimits{})
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func TestPacedAfterMaxWaitIs503WithRetryAfterAndTheLimit(t *testing.T) {
	e := newEnv(t, paceOptions(pacing.Options{Sites: mustSitePaces(t, "127.0.0.173 min-interval=3s"), MaxWait: 100 * time.Millisecond}),
		pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.173"})
	c := e.client("", "")
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first: status %d", resp.StatusCode)
	}
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != fault.ReasonPaced {
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
	e := newEnv(t, paceOptions(pacing.Options{Default: rotation.PaceLimits{MaxConcurrency: 1}, MaxWait: 20 * time.Second}), pool.StoreOptions{}, directMembers(2)...)
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
	e := newEnv(t, paceOptions(pacing.Options{Default: rotation.PaceLimits{MinInterval: 10 * time.Second}, MaxWait: 100 * time.Millisecond}),
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
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != fault.ReasonPaced {
		t.Fatalf("strict second: %d %q, want paced on its own member", resp.StatusCode, resp.Header.Get(HeaderReason))
	}
}

// A client's own pace holds its requests and says so (package pacing's
// TestClientPaceIsNeverLooserThanTheOperators pins how it meets the
// operator's).
func TestAClientsOwnPaceHoldsItsRequests(t *testing.T) {
	e := newEnv(t, paceOptions(pacing.Options{MaxWait: 50 * time.Millisecond}), pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.175"})
	c := e.client("crawler-pace-5s", "")
	if resp, _ := get(t, c, tg.URL(), nil); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != 503 || !strings.Contains(b, "the client's pace") {
		t.Fatalf("second: %d %s, want paced by the client's pace", resp.StatusCode, b)
	}
}

func TestAutoPacingCutsTheSiteAtItsFirstBan(t *testing.T) {
	members := directMembers(2)
	for _, auto := range []bool{true, false} {
		e := newEnv(t, paceOptions(pacing.Options{Auto: auto}), pool.StoreOptions{}, members...)
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
			st := e.gw.PaceStatus()
			if len(st) != 1 || st[0].Site != "127.0.0.176" || st[0].SlowedBy != string(rotation.ResultRateLimited) || st[0].Cuts != 1 {
				t.Errorf("PaceStatus %+v, want the site cut once by rate_limited", st)
			}
		}
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
			o := paceOptions(pacing.Options{Default: rotation.PaceLimits{MaxConcurrency: 1}, MaxWait: 2 * time.Second})
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

func TestASlotPastTheRequestTimeoutIsPacedAtOnceNotATimeout(t *testing.T) {
	o := paceOptions(pacing.Options{Sites: mustSitePaces(t, "127.0.0.182 min-interval=3s"), MaxWait: 10 * time.Second})
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
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != fault.ReasonPaced {
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
