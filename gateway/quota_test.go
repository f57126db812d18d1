package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func mustClients(t testing.TB, file string) []clients.Client {
	t.Helper()
	cs, err := clients.Parse(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// do sends a GET for u through c and returns the status, the reason, the
// Retry-After and the body.
func do(t *testing.T, c *http.Client, u string) (int, string, string, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(HeaderReason), resp.Header.Get("Retry-After"), string(b)
}

// A token client past its rate or its leases is answered 429
// quota_exceeded with Retry-After, before anything is leased or sent,
// while a client without a quota is served; a lease that ends gives its
// place back.
func TestAClientPastItsQuotaIs429BeforeAnythingIsLeasedOrSent(t *testing.T) {
	cs := mustClients(t, "slow tok-s all rps=0.2\nfew tok-f all leases=1\nfree tok-u all\n")
	e := newEnv(t, Options{AllowPrivateTargets: true, Clients: cs}, pool.StoreOptions{}, directMembers(2)...)
	site := testutil.StartTarget(t, testutil.TargetOptions{})

	t.Run("a rate", func(t *testing.T) {
		if code, _, _, b := do(t, e.client("crawler", "tok-s"), site.URL()+"/1"); code != 200 {
			t.Fatalf("first request: %d %q", code, b)
		}
		before := len(site.Requests())
		leases := e.store.ActiveLeases()
		code, reason, retry, b := do(t, e.client("crawler", "tok-s"), site.URL()+"/2")
		if code != http.StatusTooManyRequests || reason != "quota_exceeded" {
			t.Fatalf("second request within 5 s: %d %s %q, want 429 quota_exceeded", code, reason, b)
		}
		if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 5 {
			t.Fatalf("Retry-After %q, want 1 to 5 seconds", retry)
		}
		if !strings.Contains(b, "client slow: rps quota of 0.2 exceeded") {
			t.Fatalf("body %q does not name the client and its quota", b)
		}
		if len(site.Requests()) != before || e.store.ActiveLeases() > leases {
			t.Fatal("a refused request reached the site or leased a member")
		}
		for i := range 5 {
			if code, _, _, b := do(t, e.client("crawler", "tok-u"), site.URL()+"/u"); code != 200 {
				t.Fatalf("the client without a quota, request %d: %d %q", i, code, b)
			}
		}
	})

	t.Run("leases", func(t *testing.T) {
		// A sticky session holds its lease, so a second session has none.
		if code, _, _, b := do(t, e.client("crawler-session-a", "tok-f"), site.URL()+"/a"); code != 200 {
			t.Fatalf("session a: %d %q", code, b)
		}
		code, reason, retry, b := do(t, e.client("crawler-session-b", "tok-f"), site.URL()+"/b")
		if code != http.StatusTooManyRequests || reason != "quota_exceeded" || retry != "1" || !strings.Contains(b, "client few: leases quota of 1 exceeded") {
			t.Fatalf("session b: %d %s Retry-After %q %q, want 429 quota_exceeded naming the leases quota", code, reason, retry, b)
		}
		// The session that holds it goes on.
		for range 3 {
			if code, _, _, b := do(t, e.client("crawler-session-a", "tok-f"), site.URL()+"/a"); code != 200 {
				t.Fatalf("session a again: %d %q", code, b)
			}
		}
	})

	t.Run("bytes per day", func(t *testing.T) {
		cs := mustClients(t, "big tok-b all bytes-per-day=2000\n")
		e := newEnv(t, Options{AllowPrivateTargets: true, Clients: cs}, pool.StoreOptions{}, directMembers(1)...)
		var got int
		for i := range 200 {
			code, reason, retry, b := do(t, e.client("crawler", "tok-b"), site.URL()+"/bytes")
			if code == 200 {
				got += len(b)
				continue
			}
			if code != http.StatusTooManyRequests || reason != "quota_exceeded" || !strings.Contains(b, "client big: bytes-per-day quota of 2000 exceeded") {
				t.Fatalf("request %d: %d %s %q, want 429 quota_exceeded naming bytes-per-day", i, code, reason, b)
			}
			if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 86400 {
				t.Fatalf("Retry-After %q, want the rest of the UTC day", retry)
			}
			// The request that crossed the quota was served whole: the
			// bytes a request carries are known once it has.
			if got < 2000 {
				t.Fatalf("refused after %d body bytes, before the day's 2000", got)
			}
			return
		}
		t.Fatalf("200 requests carried %d bytes and none was refused", got)
	})

	t.Run("per-request leases give their place back", func(t *testing.T) {
		cs := mustClients(t, "one tok-1 all leases=1\n")
		e := newEnv(t, Options{AllowPrivateTargets: true, Clients: cs, Mode: rotation.ModeRequest}, pool.StoreOptions{}, directMembers(2)...)
		for i := range 6 {
			if code, _, _, b := do(t, e.client("crawler", "tok-1"), site.URL()+"/r"); code != 200 {
				t.Fatalf("request %d: %d %q: a finished request kept its place", i, code, b)
			}
		}
	})
}

func TestNewRefusesAQuotaNoStoreKeeps(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	_, err := New(Options{Pool: store, Clients: mustClients(t, "a tok all rps=5\n")})
	if err == nil || !strings.Contains(err.Error(), "client a has a quota, and this gateway's pool keeps none") {
		t.Fatalf("New: %v, want a refusal naming the client", err)
	}
	if _, err := New(Options{Pool: store, Quotas: store, Clients: mustClients(t, "a tok all rps=5\n")}); err != nil {
		t.Fatalf("with the store keeping quotas: %v", err)
	}
}

// A quota is the store's, not a process's: client A's quota holds across
// two gateways on one real redis-server while A loads both, and client B,
// unlimited, is served meanwhile; the figures are in the test log.
func TestAQuotaHoldsAcrossTwoGatewaysOnOneRedis(t *testing.T) {
	rs := redis.Start(t, redis.Options{})
	const (
		rps     = 20
		leases  = 3
		loadFor = 4 * time.Second
	)
	// The site counts each client's requests in flight (by a header the
	// crawlers send) and holds each for a while, so concurrent leases show.
	var mu sync.Mutex
	inFlight, most := map[string]int{}, map[string]int{}
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := r.Header.Get("X-Test-Client")
		mu.Lock()
		inFlight[who]++
		most[who] = max(most[who], inFlight[who])
		mu.Unlock()
		if r.URL.Path == "/slow" {
			time.Sleep(150 * time.Millisecond)
		}
		mu.Lock()
		inFlight[who]--
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	defer site.Close()

	cs := mustClients(t, fmt.Sprintf("a tok-a all rps=%d\nc tok-c all leases=%d\nb tok-b all\n", rps, leases))
	var gws []*env
	for range 2 {
		store, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: rs.URL(), Prefix: "quota-accept"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		store.SetMembers(directMembers(8))
		gw, err := New(Options{Pool: store, Quotas: store, Clients: cs, AllowPrivateTargets: true, Mode: rotation.ModeRequest, Metrics: &testRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := serveGateway(t, gw)
		gws = append(gws, &env{t: t, gw: gw, addr: addr})
	}

	type tally struct{ ok, refused, other atomic.Int64 }
	var ta, tb, tc tally
	load := func(who, token, path string, workers int, tl *tally) func() {
		return func() {
			var wg sync.WaitGroup
			deadline := time.Now().Add(loadFor)
			for w := range workers {
				wg.Go(func() {
					proxy := &url.URL{Scheme: "http", Host: gws[w%2].addr, User: url.UserPassword("crawler", token)}
					c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 30 * time.Second}
					for time.Now().Before(deadline) {
						req, _ := http.NewRequest(http.MethodGet, site.URL+path, nil)
						req.Header.Set("X-Test-Client", who)
						resp, err := c.Do(req)
						if err != nil {
							tl.other.Add(1)
							continue
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						switch {
						case resp.StatusCode == 200:
							tl.ok.Add(1)
						case resp.StatusCode == 429 && resp.Header.Get(HeaderReason) == "quota_exceeded":
							tl.refused.Add(1)
							time.Sleep(5 * time.Millisecond)
						default:
							tl.other.Add(1)
						}
					}
				})
			}
			wg.Wait()
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(load("a", "tok-a", "/fast", 8, &ta))
	wg.Go(load("c", "tok-c", "/slow", 12, &tc))
	wg.Go(load("b", "tok-b", "/fast", 4, &tb))
	wg.Wait()
	took := time.Since(start).Seconds()

	t.Logf("client a (rps=%d) over %.1fs on two gateways: %d served (%.1f/s), %d refused 429 quota_exceeded, %d other",
		rps, took, ta.ok.Load(), float64(ta.ok.Load())/took, ta.refused.Load(), ta.other.Load())
	t.Logf("client c (leases=%d, each request held 150ms at the site): %d served (%.1f/s), %d refused 429 quota_exceeded, %d other; at most %d in flight at the site",
		leases, tc.ok.Load(), float64(tc.ok.Load())/took, tc.refused.Load(), tc.other.Load(), most["c"])
	t.Logf("client b (no quota) meanwhile: %d served (%.1f/s), %d refused, %d other",
		tb.ok.Load(), float64(tb.ok.Load())/took, tb.refused.Load(), tb.other.Load())

	// GCRA: at most rps×T + a burst of rps, whatever the gateways.
	if limit := int64(rps*took) + rps; ta.ok.Load() > limit || ta.ok.Load() < rps {
		t.Errorf("client a was served %d requests in %.1fs, want %d (a burst) to its quota's %d", ta.ok.Load(), took, rps, limit)
	}
	if ta.refused.Load() == 0 || tc.refused.Load() == 0 {
		t.Error("a limited client was never refused: the load did not reach its quota")
	}
	if most["c"] > leases || tc.ok.Load() == 0 {
		t.Errorf("client c had %d requests in flight (served %d), want 1 to its %d leases", most["c"], tc.ok.Load(), leases)
	}
	if tb.refused.Load() != 0 || tb.other.Load() != 0 {
		t.Errorf("client b, without a quota, was refused %d and failed %d times", tb.refused.Load(), tb.other.Load())
	}
	if tb.ok.Load() <= ta.ok.Load() {
		t.Errorf("client b was served %d, no more than the limited client a's %d", tb.ok.Load(), ta.ok.Load())
	}
	if ta.other.Load() != 0 || tc.other.Load() != 0 {
		t.Errorf("limited clients got %d and %d answers other than 200 and 429 quota_exceeded", ta.other.Load(), tc.other.Load())
	}
}
