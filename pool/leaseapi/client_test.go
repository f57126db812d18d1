package leaseapi_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func newTestClient(t testing.TB, f *apiFixture, token string) *leaseapi.Client {
	t.Helper()
	c, err := leaseapi.NewClient(f.srv.URL, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientRoundTripsThePoolContract(t *testing.T) {
	const token = "tok"
	f := newAPIFixture(t, pool.StoreOptions{MaxTTL: time.Hour}, leaseapi.APIOptions{Token: token}, testMembers(t))
	c := newTestClient(t, f, token)
	ctx := context.Background()
	now := f.clock.Now()

	lease, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}, Target: "Example.com:443", TTL: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("acquire returns a usable member with credentials", func(t *testing.T) {
		if lease.ID == "" || lease.Member.Name != "a" {
			t.Fatalf("lease = %+v", lease)
		}
		if lease.Member.URL == nil || lease.Member.URL.String() != "http://user:secret-a@127.0.0.1:3128" {
			t.Errorf("member URL = %v", lease.Member.URL)
		}
		if pw, _ := lease.Member.URL.User.Password(); pw != "secret-a" {
			t.Errorf("password = %q", pw)
		}
		if lease.Member.Attributes["tier"] != "dc" || lease.Target != "example.com" {
			t.Errorf("attributes %v target %q", lease.Member.Attributes, lease.Target)
		}
		if lease.TTL != 90*time.Second || !lease.ExpiresAt.Equal(now.Add(90*time.Second)) {
			t.Errorf("ttl %s expiresAt %s", lease.TTL, lease.ExpiresAt)
		}
	})
	t.Run("sub-second TTLs round up to a whole second", func(t *testing.T) {
		l, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: "c", TTL: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL != 2*time.Second {
			t.Errorf("ttl = %s, want 2s", l.TTL)
		}
		if err := c.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("list shows the lease and redacts passwords", func(t *testing.T) {
		ps, err := c.List(ctx, leaseapi.ListFilter{Attributes: map[string]string{"region": "eu"}, HealthyOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 2 || ps[0].Name != "a" || ps[1].Name != "b" {
			t.Fatalf("list = %+v", ps)
		}
		if ps[0].ActiveLeases != 1 || ps[0].URL != "http://user:xxxxx@127.0.0.1:3128" {
			t.Errorf("a = %+v", ps[0])
		}
	})
	t.Run("report cools the member down for the lease's target", func(t *testing.T) {
		if err := c.Report(ctx, lease.ID, pool.Report{Result: rotation.ResultRateLimited, RetryAfter: 20 * time.Second}); err != nil {
			t.Fatal(err)
		}
		ps, err := c.List(ctx, leaseapi.ListFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if cd := ps[0].Cooldowns; len(cd) != 1 || cd[0].Target != "example.com" || !cd[0].Until.Equal(now.Add(20*time.Second)) {
			t.Errorf("a cooldowns = %+v", cd)
		}
		_, err = c.Acquire(ctx, pool.AcquireRequest{Proxy: "a", Target: "example.com"})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) || nm.Considered != 1 || nm.InCooldown != 1 {
			t.Errorf("acquire of the cooled member: %v, want NoMatchError{1 considered, 1 in cooldown}", err)
		}
		if l, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: "a", Target: "example.org"}); err != nil || l.Member.Name != "a" {
			t.Errorf("acquire for another target: %+v, %v", l, err)
		}
	})
	t.Run("release is idempotent", func(t *testing.T) {
		for range 2 {
			if err := c.Release(ctx, lease.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Release(ctx, "never-issued"); err != nil {
			t.Errorf("release of an unknown lease: %v", err)
		}
	})
}

func TestClientMapsErrors(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{MaxTTL: time.Minute, MaxLeasesPerMember: 1}, leaseapi.APIOptions{Token: "right"}, testMembers(t))
	f.store.SetHealth("b", false, 0)
	ctx := context.Background()
	good := newTestClient(t, f, "right")
	if _, err := good.Acquire(ctx, pool.AcquireRequest{Proxy: "c"}); err != nil {
		t.Fatal(err)
	}

	t.Run("409 is a NoMatchError with the counts", func(t *testing.T) {
		_, err := good.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"tier": "res"}})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) || *nm != (pool.NoMatchError{Considered: 1, Unhealthy: 1}) {
			t.Errorf("err = %v, want NoMatchError{Considered:1 Unhealthy:1}", err)
		}
		_, err = good.Acquire(ctx, pool.AcquireRequest{Proxy: "c"})
		if !errors.As(err, &nm) || nm.AtCapacity != 1 {
			t.Errorf("err = %v, want AtCapacity 1", err)
		}
	})
	t.Run("TTL above the maximum wraps ErrTTLTooLong", func(t *testing.T) {
		_, err := good.Acquire(ctx, pool.AcquireRequest{TTL: 2 * time.Minute})
		if !errors.Is(err, pool.ErrTTLTooLong) {
			t.Errorf("err = %v, want ErrTTLTooLong", err)
		}
	})
	t.Run("report on an unknown lease wraps ErrUnknownLease", func(t *testing.T) {
		err := good.Report(ctx, "nope", pool.Report{Result: rotation.ResultBanned})
		if !errors.Is(err, pool.ErrUnknownLease) {
			t.Errorf("err = %v, want ErrUnknownLease", err)
		}
	})
	t.Run("invalid result is an APIError 400", func(t *testing.T) {
		l, err := good.Acquire(ctx, pool.AcquireRequest{Proxy: "a"})
		if err != nil {
			t.Fatal(err)
		}
		err = good.Report(ctx, l.ID, pool.Report{Result: "nonsense"})
		var apiErr *leaseapi.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Code != "invalid_result" {
			t.Errorf("err = %v, want APIError 400 invalid_result", err)
		}
	})
	t.Run("wrong token is an APIError 401, not unreachable", func(t *testing.T) {
		bad := newTestClient(t, f, "wrong")
		_, err := bad.List(ctx, leaseapi.ListFilter{})
		var apiErr *leaseapi.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 401 || apiErr.Code != "unauthorized" {
			t.Errorf("err = %v, want APIError 401", err)
		}
		if errors.Is(err, pool.ErrUnreachable) {
			t.Error("a 401 counts as unreachable")
		}
	})
	t.Run("a closed port wraps ErrUnreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		c, err := leaseapi.NewClient("http://"+addr, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Acquire(ctx, pool.AcquireRequest{})
		if !errors.Is(err, pool.ErrUnreachable) {
			t.Errorf("err = %v, want ErrUnreachable", err)
		}
		if err := c.Release(ctx, "x"); !errors.Is(err, pool.ErrUnreachable) {
			t.Errorf("release err = %v, want ErrUnreachable", err)
		}
	})
	t.Run("a cancelled context wraps ErrUnreachable and the context error", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := good.Acquire(cctx, pool.AcquireRequest{})
		if !errors.Is(err, pool.ErrUnreachable) || !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want ErrUnreachable and context.Canceled", err)
		}
	})
	t.Run("503 from something in between counts as unreachable", func(t *testing.T) {
		lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
		}))
		defer lb.Close()
		c, err := leaseapi.NewClient(lb.URL, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Acquire(ctx, pool.AcquireRequest{})
		var apiErr *leaseapi.APIError
		if !errors.Is(err, pool.ErrUnreachable) || !errors.As(err, &apiErr) || apiErr.Message != "no healthy upstream" {
			t.Errorf("err = %v, want ErrUnreachable with the body as message", err)
		}
	})
}

func TestNewClientValidatesTheURL(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		ok        bool
	}{
		{"http", "http://127.0.0.1:8090", true},
		{"https with a path prefix and trailing slash", "https://pool.example/api/", true},
		{"no scheme", "127.0.0.1:8090", false},
		{"ftp scheme", "ftp://127.0.0.1", false},
		{"no host", "http://", false},
		{"credentials in the URL", "http://u:p@127.0.0.1:8090", false},
		{"query", "http://127.0.0.1:8090/?x=1", false},
		{"garbage", "http://[::1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := leaseapi.NewClient(tc.url, "", nil)
			if (err == nil) != tc.ok {
				t.Errorf("NewClient(%q) err = %v, want ok=%v", tc.url, err, tc.ok)
			}
		})
	}
	if _, err := leaseapi.NewClient("http://127.0.0.1:1", "a\nb", nil); err == nil {
		t.Error("a token with a line break was accepted")
	}
	for _, raw := range []string{"http://u:hunter2@127.0.0.1:8090", "http://u:hunter2@127.0.0.1:port", "http://127.0.0.1:8090/?token=hunter2"} {
		if _, err := leaseapi.NewClient(raw, "", nil); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("NewClient(%q) err = %v, want an error without the secret", raw, err)
		}
	}
}

func TestClientUsesAPathPrefix(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	mux := http.NewServeMux()
	mux.Handle("/lease-api/", http.StripPrefix("/lease-api", f.srv.Config.Handler))
	prefixed := httptest.NewServer(mux)
	defer prefixed.Close()
	c, err := leaseapi.NewClient(prefixed.URL+"/lease-api/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := c.List(context.Background(), leaseapi.ListFilter{}); err != nil || len(ps) != 3 {
		t.Errorf("list through a prefix: %d members, %v", len(ps), err)
	}
}

func TestClientNeverUsesAnEnvironmentProxy(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	// A transport whose Proxy func points at a dead port: if the client kept it,
	// every call would fail. (http.ProxyFromEnvironment itself exempts loopback,
	// so a set HTTP_PROXY could not show the difference here.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var proxyAsked atomic.Int32
	tr := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) {
		proxyAsked.Add(1)
		return &url.URL{Scheme: "http", Host: dead}, nil
	}}
	c, err := leaseapi.NewClient(f.srv.URL, "", &http.Client{Transport: tr, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(context.Background(), leaseapi.ListFilter{}); err != nil {
		t.Errorf("list with a proxying transport: %v", err)
	}
	if n := proxyAsked.Load(); n != 0 {
		t.Errorf("the transport's Proxy func was consulted %d times", n)
	}
	if tr.Proxy == nil {
		t.Error("NewClient modified the caller's transport instead of cloning it")
	}
}

func TestClientReusesConnections(t *testing.T) {
	var conns atomic.Int32
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t), func(s *httptest.Server) {
		s.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
	})
	c := newTestClient(t, f, "")
	ctx := context.Background()
	for range 100 {
		l, err := c.Acquire(ctx, pool.AcquireRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A 409 and a 404 must not cost the connection either.
	_, _ = c.Acquire(ctx, pool.AcquireRequest{Proxy: "nope"})
	_ = c.Report(ctx, "nope", pool.Report{Result: rotation.ResultOK})
	if _, err := c.Acquire(ctx, pool.AcquireRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("202 sequential calls opened %d connections, want 1 (keep-alive)", n)
	}
}

func TestClientConcurrentAcquireRelease(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{MaxLeasesPerMember: 4}, leaseapi.APIOptions{Token: "t"}, testMembers(t))
	c := newTestClient(t, f, "t")
	ctx := context.Background()
	var wg sync.WaitGroup
	var granted, full atomic.Int32
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				l, err := c.Acquire(ctx, pool.AcquireRequest{Target: "example.com"})
				var nm *pool.NoMatchError
				switch {
				case errors.As(err, &nm):
					full.Add(1)
					continue
				case err != nil:
					errs <- err
					return
				}
				granted.Add(1)
				if err := c.Release(ctx, l.ID); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if granted.Load()+full.Load() != 16*50 || granted.Load() == 0 {
		t.Errorf("granted %d + no_match %d != %d", granted.Load(), full.Load(), 16*50)
	}
	ps, err := c.List(ctx, leaseapi.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.ActiveLeases != 0 {
			t.Errorf("%s still has %d leases after every release", p.Name, p.ActiveLeases)
		}
	}
}

func TestClientDirectMemberRoundTrip(t *testing.T) {
	members := []pool.Member{{Name: "direct"}}
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, members)
	c := newTestClient(t, f, "")
	l, err := c.Acquire(context.Background(), pool.AcquireRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Member.Direct() || l.Member.SourceAddr.IsValid() {
		t.Errorf("member = %+v, want direct without source address", l.Member)
	}
}

// BenchmarkAPIAcquireRelease measures one acquire plus one release through
// the Client over real HTTP on loopback (goal: >= 10k pairs/s).
func BenchmarkAPIAcquireRelease(b *testing.B) {
	f := newAPIFixture(b, pool.StoreOptions{}, leaseapi.APIOptions{Token: "bench-token"}, testMembers(b))
	c := newTestClient(b, f, "bench-token")
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4) // several requests in flight per core, as a gateway has
	cpu0, cpuOK := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := c.Acquire(ctx, pool.AcquireRequest{Target: "example.com"})
			if err != nil {
				b.Error(err)
				return
			}
			if err := c.Release(ctx, l.ID); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	if cpu1, ok := processCPU(); ok && cpuOK {
		// Client and server share this process: this is both ends' CPU.
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-µs/pair")
	}
}

// TestClientRetriesALostReplicaWithoutTakingTwoLeases: two lease API
// replicas on one store; the first grants the lease and then loses the
// connection before answering (a replica killed mid-request). The client
// retries on the second URL with the same idempotency key and gets the
// same lease: the store holds one lease, not two.
func TestClientRetriesALostReplicaWithoutTakingTwoLeases(t *testing.T) {
	st := pool.NewStore(pool.StoreOptions{})
	st.SetMembers(testMembers(t))
	api := leaseapi.NewAPIServer(st, leaseapi.APIOptions{})
	var dropped atomic.Int32
	lossy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.ServeHTTP(httptest.NewRecorder(), r) // the lease is taken...
		dropped.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack() // ...and the answer never arrives
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer lossy.Close()
	good := httptest.NewServer(api)
	defer good.Close()

	c, err := leaseapi.NewClient(lossy.URL+","+good.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), pool.AcquireRequest{Target: "site.com"})
	if err != nil {
		t.Fatalf("acquire across a lost replica: %v", err)
	}
	if dropped.Load() != 1 {
		t.Fatalf("the lossy replica saw %d requests, want 1", dropped.Load())
	}
	if n := st.ActiveLeases(); n != 1 {
		t.Fatalf("the store holds %d leases after one retried acquire, want 1", n)
	}
	// Later calls stay on the replica that answered.
	if err := c.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if dropped.Load() != 1 || st.ActiveLeases() != 0 {
		t.Fatalf("release: lossy saw %d, active %d", dropped.Load(), st.ActiveLeases())
	}
	// A dead first URL (nothing listens) is skipped the same way.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	c2, err := leaseapi.NewClient(deadURL+", "+good.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Acquire(context.Background(), pool.AcquireRequest{}); err != nil {
		t.Fatalf("acquire with the first URL dead: %v", err)
	}
	if _, err := leaseapi.NewClient(good.URL+",ftp://x", "", nil); err == nil {
		t.Fatal("a bad second URL was accepted")
	}
}
