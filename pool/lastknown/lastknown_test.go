package lastknown_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// API states of the fixture.
const (
	apiUp        = iota
	apiGone      // connections are closed before an answer: a stopped controller
	apiStoreDown // 503 store_unavailable: a controller whose Redis fails over
)

// fixture is a real lease API (the controller's view: a pool.Store) that a
// test can take away, and the last-known pool of a gateway leasing from it.
type fixture struct {
	api   *pool.Store
	state atomic.Int32
	srv   *httptest.Server
	clk   *clocktesting.FakeClock
	lk    *lastknown.Pool
	rec   *counts
}

type counts struct{ outages, leases atomic.Int64 }

func (c *counts) PoolOutage()     { c.outages.Add(1) }
func (c *counts) LastKnownLease() { c.leases.Add(1) }

const token = "lk-t0ken"

func members(n int) []pool.Member {
	out := make([]pool.Member, n)
	for i := range out {
		out[i] = pool.Member{Name: string(rune('a' + i)), URL: &url.URL{Scheme: "http", User: url.UserPassword("crawler", "pw-"+string(rune('a'+i))), Host: "127.0.0.1:" + string(rune('1'+i)) + "128"}}
	}
	return out
}

// start runs the API over three members and a last-known pool in front of
// it with a refresh of 50 ms and a probe of 20 ms; run false leaves Run to
// the test.
func start(t *testing.T, o lastknown.Options, run bool) *fixture {
	t.Helper()
	f := &fixture{api: pool.NewStore(pool.StoreOptions{}), rec: &counts{}, clk: clocktesting.NewFakeClock(time.Now())}
	f.api.SetMembers(members(3))
	h := leaseapi.NewAPIServer(f.api, leaseapi.APIOptions{Token: token})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch f.state.Load() {
		case apiGone:
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		case apiStoreDown:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"store_unavailable","message":"lease store unavailable"}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	c, err := leaseapi.NewClient(f.srv.URL, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Remote, o.Clock, o.Recorder = c, f.clk, f.rec
	if o.Refresh == 0 {
		o.Refresh = 50 * time.Millisecond
	}
	if o.Probe == 0 {
		o.Probe = 20 * time.Millisecond
	}
	if f.lk, err = lastknown.New(o); err != nil {
		t.Fatal(err)
	}
	if run {
		f.run(t)
		poll.Until(t, 10*time.Second, "the first member list", func() error {
			if f.lk.Status().ListAt.IsZero() {
				return errors.New("no member list yet")
			}
			return nil
		})
	}
	return f
}

func (f *fixture) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.lk.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func (f *fixture) acquire(t *testing.T, target string) pool.Lease {
	t.Helper()
	l, err := f.lk.Acquire(context.Background(), pool.AcquireRequest{Target: target})
	if err != nil {
		t.Fatalf("Acquire(%s): %v", target, err)
	}
	return l
}

// apiCooldown is the API's cooldown of member for target (zero: none).
func (f *fixture) apiCooldown(member, target string) time.Time {
	for _, m := range f.api.Members() {
		if m.Name == member {
			return m.Cooldowns[target]
		}
	}
	return time.Time{}
}

func local(l pool.Lease) bool { return strings.HasPrefix(l.ID, "local-") }

// TestAStoppedAPIIsRiddenOutWithTheLastKnownMembers: with the API gone (and
// with its store failing over), leases come from the last-known members,
// the very call that found the API away included, with their credentials
// and in the store's order (per-request leases spread over every member);
// the outage is counted once; and the API's return ends it.
func TestAStoppedAPIIsRiddenOutWithTheLastKnownMembers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state int32
	}{{"connections closed", apiGone}, {"503 store_unavailable", apiStoreDown}} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, lastknown.Options{}, true)
			if l := f.acquire(t, "site"); local(l) {
				t.Fatalf("with the API up the lease %s came from the last-known list", l.ID)
			}
			f.state.Store(tc.state)
			seen := map[string]bool{}
			for range 6 {
				l := f.acquire(t, "site")
				if !local(l) {
					t.Fatalf("with the API away the lease %s is not the gateway's own", l.ID)
				}
				if pw, _ := l.Member.URL.User.Password(); pw != "pw-"+l.Member.Name {
					t.Fatalf("lease on %s carries URL %s, want its credentials", l.Member.Name, l.Member.URL.Redacted())
				}
				seen[l.Member.Name] = true
				if err := f.lk.Release(context.Background(), l.ID); err != nil {
					t.Fatal(err)
				}
			}
			if len(seen) != 3 {
				t.Fatalf("six per-request leases went to %v, want every member", seen)
			}
			st := f.lk.Status()
			if !st.Down || st.Refusing || st.Members != 3 {
				t.Fatalf("status %+v, want down, serving from 3 members", st)
			}
			if f.rec.outages.Load() != 1 || f.rec.leases.Load() != 6 {
				t.Fatalf("recorded %d outages and %d last-known leases, want 1 and 6", f.rec.outages.Load(), f.rec.leases.Load())
			}
			f.state.Store(apiUp)
			poll.Until(t, 10*time.Second, "the API to be up again", func() error {
				if f.lk.Status().Down {
					return errors.New("still down")
				}
				return nil
			})
			if l := f.acquire(t, "site"); local(l) {
				t.Fatalf("after the API's return the lease %s came from the last-known list", l.ID)
			}
			if f.rec.outages.Load() != 1 {
				t.Fatalf("recorded %d outages, want 1", f.rec.outages.Load())
			}
		})
	}
}

// TestABanLearntDuringTheOutageIsToldToTheAPI: a ban reported on a lease the
// gateway granted itself, and one on a lease the API granted before it went
// away, rest their pairs locally at once and, when the API returns, in the
// API's store too — until at least the local window's end — and leases
// from the API keep away from them.
func TestABanLearntDuringTheOutageIsToldToTheAPI(t *testing.T) {
	f := start(t, lastknown.Options{Store: pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: 10 * time.Minute, Max: time.Hour}}}, true)
	ctx := context.Background()
	before := f.acquire(t, "old.example") // the API's lease, held across the outage
	f.state.Store(apiGone)

	own := f.acquire(t, "site.example")
	if !local(own) {
		t.Fatalf("lease %s is not the gateway's own", own.ID)
	}
	if err := f.lk.Report(ctx, own.ID, pool.Report{Result: rotation.ResultBanned}); err != nil {
		t.Fatal(err)
	}
	if err := f.lk.Report(ctx, before.ID, pool.Report{Result: rotation.ResultRateLimited, RetryAfter: 5 * time.Minute}); err != nil {
		t.Fatalf("a report on the API's lease during the outage: %v, want it kept for later", err)
	}
	for range 4 {
		l := f.acquire(t, "site.example")
		if l.Member.Name == own.Member.Name {
			t.Fatalf("the banned %s was leased again for site.example during the outage", own.Member.Name)
		}
		_ = f.lk.Release(ctx, l.ID)
	}
	if st := f.lk.Status(); st.Untold != 2 {
		t.Fatalf("status %+v, want 2 untold cooldowns", st)
	}
	f.state.Store(apiUp)
	poll.Until(t, 10*time.Second, "the untold cooldowns told", func() error {
		if st := f.lk.Status(); st.Down || st.Untold != 0 {
			return errors.New("not yet told")
		}
		return nil
	})
	now := time.Now()
	if until := f.apiCooldown(own.Member.Name, "site.example"); until.Before(now.Add(9 * time.Minute)) {
		t.Fatalf("the API rests %s for site.example until %v, want the local ten minutes", own.Member.Name, until)
	}
	if until := f.apiCooldown(before.Member.Name, "old.example"); until.Before(now.Add(4 * time.Minute)) {
		t.Fatalf("the API rests %s for old.example until %v, want the site's five minutes", before.Member.Name, until)
	}
	for range 4 {
		l := f.acquire(t, "site.example")
		if local(l) || l.Member.Name == own.Member.Name {
			t.Fatalf("after the return lease %s went to %s, want the API's, not the banned member", l.ID, l.Member.Name)
		}
		_ = f.lk.Release(ctx, l.ID)
	}
}

// TestTheLongerCooldownWinsOnBothSides: a cooldown the API set during the
// outage (another gateway's) that is longer than the local one reaches the
// local store on the return, and the local longer one the API.
func TestTheLongerCooldownWinsOnBothSides(t *testing.T) {
	f := start(t, lastknown.Options{Store: pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Minute, Max: time.Hour}}}, true)
	ctx := context.Background()
	f.state.Store(apiGone)
	l := f.acquire(t, "site.example")
	if err := f.lk.Report(ctx, l.ID, pool.Report{Result: rotation.ResultBanned}); err != nil { // one minute here
		t.Fatal(err)
	}
	// Meanwhile another gateway's report rests the same pair for 20
	// minutes in the API's store.
	al, err := f.api.Acquire(ctx, pool.AcquireRequest{Proxy: l.Member.Name, Target: "site.example"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.api.Report(ctx, al.ID, pool.Report{Result: rotation.ResultRateLimited, RetryAfter: 20 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	f.state.Store(apiUp)
	poll.Until(t, 10*time.Second, "the cooldown reported while down to reach the API", func() error {
		if f.lk.Status().Down {
			return errors.New("still down")
		}
		for _, m := range f.lk.Members() {
			if m.Name == l.Member.Name && m.Cooldowns["site.example"].After(time.Now().Add(19*time.Minute)) {
				return nil
			}
		}
		return errors.New("the local store does not have the API's longer window yet")
	})
	if until := f.apiCooldown(l.Member.Name, "site.example"); until.Before(time.Now().Add(19 * time.Minute)) {
		t.Fatalf("the API's longer window was cut to %v", until)
	}
}

// TestAnOutageWithoutAListOrBeyondTheGraceIsRefused: a gateway that never
// received a list, and one whose outage outlasts the grace, answer with
// pool.ErrUnreachable, and say why.
func TestAnOutageWithoutAListOrBeyondTheGraceIsRefused(t *testing.T) {
	t.Run("no list ever received", func(t *testing.T) {
		f := start(t, lastknown.Options{}, false)
		f.state.Store(apiGone)
		_, err := f.lk.Acquire(context.Background(), pool.AcquireRequest{Target: "site"})
		if !errors.Is(err, pool.ErrUnreachable) || !strings.Contains(err.Error(), "no member list was received") {
			t.Fatalf("Acquire: %v, want ErrUnreachable saying no list was received", err)
		}
		if st := f.lk.Status(); !st.Down || !st.Refusing {
			t.Fatalf("status %+v, want down and refusing", st)
		}
	})
	t.Run("beyond the grace", func(t *testing.T) {
		f := start(t, lastknown.Options{Grace: time.Minute}, true)
		f.state.Store(apiGone)
		f.acquire(t, "site") // from the list: inside the grace
		f.clk.Step(61 * time.Second)
		_, err := f.lk.Acquire(context.Background(), pool.AcquireRequest{Target: "site"})
		if !errors.Is(err, pool.ErrUnreachable) || !strings.Contains(err.Error(), "longer than the outage grace of 1m0s") {
			t.Fatalf("Acquire beyond the grace: %v, want ErrUnreachable naming the grace", err)
		}
		if st := f.lk.Status(); !st.Refusing || !strings.Contains(st.Why, "--pool-outage-grace") {
			t.Fatalf("status %+v, want refusing, saying why", st)
		}
		// The API's return is noticed by the next request, too.
		f.state.Store(apiUp)
		if l := f.acquire(t, "site"); local(l) {
			t.Fatalf("lease %s after the API's return is the gateway's own", l.ID)
		}
	})
}

// TestARefusalIsNoOutage: a 409 and a refused token are the API's answers
// about the request, not an outage: they are returned as they are.
func TestARefusalIsNoOutage(t *testing.T) {
	f := start(t, lastknown.Options{}, true)
	_, err := f.lk.Acquire(context.Background(), pool.AcquireRequest{Proxy: "nobody"})
	var nm *pool.NoMatchError
	if !errors.As(err, &nm) {
		t.Fatalf("Acquire of an unknown member: %v, want the API's 409", err)
	}
	if st := f.lk.Status(); st.Down || f.rec.outages.Load() != 0 {
		t.Fatalf("a 409 started an outage: %+v", st)
	}
}

// TestALeaseLetGoDuringTheOutageIsReleasedOnTheReturn: a lease of the API
// the gateway released while the API was away stops counting as active
// there once it answers, not only when its TTL ends.
func TestALeaseLetGoDuringTheOutageIsReleasedOnTheReturn(t *testing.T) {
	f := start(t, lastknown.Options{}, true)
	held := f.acquire(t, "site.example")
	f.state.Store(apiGone)
	if own := f.acquire(t, "site.example"); !local(own) {
		t.Fatalf("lease %s during the outage is not the gateway's own", own.ID)
	}
	f.lk.ReleaseLater(held.ID)
	if n := f.api.ActiveLeases(); n != 1 {
		t.Fatalf("the API holds %d active leases during the outage, want the one let go", n)
	}
	f.state.Store(apiUp)
	poll.Until(t, 10*time.Second, "the lease let go during the outage released at the API", func() error {
		if n := f.api.ActiveLeases(); n != 0 {
			return errors.New("still active")
		}
		return nil
	})
}

// storeDown is a lease store as a Remote whose calls fail as the Redis
// store's do while Redis is away (pool.ErrStoreUnavailable) when down is
// set. The real Redis outage is gateway/daemon's TestARedisRestartCostsNoRequest.
type storeDown struct {
	*pool.Store
	down atomic.Bool
}

var errAway = fmt.Errorf("%w: acquire: connection refused", pool.ErrStoreUnavailable)

func (s *storeDown) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	if s.down.Load() {
		return pool.Lease{}, errAway
	}
	return s.Store.Acquire(ctx, req)
}

func (s *storeDown) Members(context.Context) ([]pool.MemberStatus, error) {
	if s.down.Load() {
		return nil, errAway
	}
	return s.Store.Members(), nil
}

// TestAStoreOutageIsAnOutage: a shared store that does not answer (a
// Redis restart under a --lease-store gateway) is ridden out as the lease
// API is.
func TestAStoreOutageIsAnOutage(t *testing.T) {
	st := &storeDown{Store: pool.NewStore(pool.StoreOptions{})}
	st.SetMembers(members(2))
	lk, err := lastknown.New(lastknown.Options{Remote: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); lk.Run(ctx) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, 10*time.Second, "the member list", func() error {
		if lk.Status().ListAt.IsZero() {
			return errors.New("no list yet")
		}
		return nil
	})
	st.down.Store(true)
	l, err := lk.Acquire(ctx, pool.AcquireRequest{Target: "site.example"})
	if err != nil || !local(l) {
		t.Fatalf("with the store away: lease %+v, %v; want the gateway's own", l, err)
	}
}

// TestAStoresFailureRestsStayFailureRestsDuringItsOutage: the last-known
// pool of a store remote takes the store's cooldowns with their reasons,
// so with every member resting for its own failures when the store goes
// away, the least recently failed is still leased (rotation.FailureRest),
// not refused as if banned.
func TestAStoresFailureRestsStayFailureRestsDuringItsOutage(t *testing.T) {
	st := &storeDown{Store: pool.NewStore(pool.StoreOptions{FailureRest: rotation.FailureRest{MaxPercent: 100}})}
	st.SetMembers(members(2))
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		l, err := st.Store.Acquire(ctx, pool.AcquireRequest{Proxy: name})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Report(ctx, l.ID, pool.Report{Result: rotation.ResultUpstreamFailed}); err != nil {
			t.Fatal(err)
		}
	}
	lk, err := lastknown.New(lastknown.Options{Remote: st})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); lk.Run(rctx) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, 10*time.Second, "the member list", func() error {
		if lk.Status().ListAt.IsZero() {
			return errors.New("no list yet")
		}
		return nil
	})
	st.down.Store(true)
	l, err := lk.Acquire(ctx, pool.AcquireRequest{Target: "site.example"})
	if err != nil || !local(l) || !l.FailureRest {
		t.Fatalf("every member resting for its failures, store away: lease %+v, %v; want the gateway's own override", l, err)
	}
}
