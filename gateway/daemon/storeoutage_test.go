//go:build !sidecar

package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/gateway/daemon/daemontest"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leasestore"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestARedisRestartCostsNoRequest: a gateway on a Redis lease store (AOF)
// whose Redis is killed -9 and restarted (reading a long AOF, so answering
// LOADING for a while) keeps serving every request from
// what it holds (its members, cooldowns and its own leases, recorded
// locally), says so on its metrics, and tells Redis a ban it learnt
// meanwhile once Redis is back.
func TestARedisRestartCostsNoRequest(t *testing.T) {
	rd := redis.Start(t, redis.Options{})
	var refused atomic.Int64
	var bannedIP atomic.Value // the source the ban site refuses: the first it sees
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The ban site refuses the first member that asks it, and only that
		// one: which member the pool picks first is the pool's business.
		if r.URL.Path == "/ban" {
			ip, _, _ := net.SplitHostPort(r.RemoteAddr)
			bannedIP.CompareAndSwap(nil, ip)
			if bannedIP.Load() == ip {
				refused.Add(1)
				w.WriteHeader(http.StatusForbidden)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer site.Close()
	_, port, _ := net.SplitHostPort(site.Listener.Addr().String())

	cfg := testConfig()
	cfg.MetricsListen, cfg.AllowPrivateTargets, cfg.Mode = "127.0.0.1:0", true, rotation.ModeRequest
	cfg.Static = []pool.Member{
		{Name: "d2", SourceAddr: netip.MustParseAddr("127.0.0.2")},
		{Name: "d3", SourceAddr: netip.MustParseAddr("127.0.0.3")},
	}
	cfg.LeaseStore = leasestore.Config{URL: rd.URL(), Prefix: "outage"}
	cfg.OutageGrace = 5 * time.Minute // --pool-outage-grace's default
	g := startGateway(t, cfg)
	proxyURL, _ := url.Parse("http://" + g.Proxy)
	viaProxy := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}, Timeout: 20 * time.Second}
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	for range 4 {
		if code, body := daemontest.Get(t, viaProxy, site.URL+"/warm"); code != http.StatusOK {
			t.Fatalf("before the restart: %d %q", code, body)
		}
	}

	// Requests all along, one after another; every answer must be the site's.
	var served, failed atomic.Int64
	var firstFail atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := viaProxy.Get(site.URL + "/load")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != http.StatusOK {
				failed.Add(1)
				msg := fmt.Sprint(err)
				if resp != nil {
					msg = resp.Status + " " + resp.Header.Get("X-Proxyfleet-Reason")
				}
				firstFail.CompareAndSwap(nil, msg)
				continue
			}
			served.Add(1)
		}
	})
	time.Sleep(500 * time.Millisecond)
	ballast(t, rd.Addr())
	if err := rd.Kill(); err != nil {
		t.Fatal(err)
	}
	// Down: a ban learnt now (the member the ban site sees first is
	// refused; the request is retried on the other and served).
	poll.Until(t, 20*time.Second, "the gateway to notice the outage", func() error {
		_, body := daemontest.Get(t, plain, "http://"+g.Metrics+"/metrics")
		return poll.Check(regexp.MustCompile(`proxyfleet_gateway_pool_outage [12]`).MatchString(body), "outage gauge not set")
	})
	banSite := "http://localhost:" + port
	if code, body := daemontest.Get(t, viaProxy, banSite+"/ban"); code != http.StatusOK || refused.Load() != 1 {
		t.Fatalf("the ban site during the outage: %d %q after %d refusals; want it served on the second member after one", code, body, refused.Load())
	}
	banned := map[string]string{"127.0.0.2": "d2", "127.0.0.3": "d3"}[bannedIP.Load().(string)]
	time.Sleep(1500 * time.Millisecond)
	// Back from its AOF, which the ballast makes long enough to read that
	// Redis answers LOADING for a while: that costs no request either.
	loading := make(chan bool, 1)
	go func() { loading <- sawLoading(rd.Addr(), 60*time.Second) }()
	rd.Start()
	if !<-loading {
		t.Fatal("Redis never answered LOADING while it read its AOF: the ballast is too small to test that")
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed across the Redis restart; the first: %v", n, n+served.Load(), firstFail.Load())
	}
	if served.Load() < 10 {
		t.Fatalf("only %d requests went through during the test", served.Load())
	}

	// Redis is back: the ban learnt meanwhile is in it, and the gauge is 0.
	peek, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: rd.URL(), Prefix: "outage"})
	if err != nil {
		t.Fatal(err)
	}
	defer peek.Close()
	poll.Until(t, 30*time.Second, "the ban learnt during the outage to reach Redis", func() error {
		cds, err := peek.ListCooldowns(context.Background())
		if err != nil {
			return err
		}
		for _, cd := range cds {
			if cd.Member == banned && cd.Target == "localhost" {
				return nil
			}
		}
		return fmt.Errorf("cooldowns in Redis: %+v", cds)
	})
	poll.Until(t, 30*time.Second, "the outage to end on the metrics", func() error {
		_, body := daemontest.Get(t, plain, "http://"+g.Metrics+"/metrics")
		return poll.Check(strings.Contains(body, "proxyfleet_gateway_pool_outage 0") &&
			regexp.MustCompile(`proxyfleet_gateway_pool_outages_total [1-9]`).MatchString(body), "outage metrics: %s", grepLines(body, "pool_outage"))
	})
}

// ballast fills Redis with keys no store uses, about 60 MB of AOF, so
// that a restart reads its AOF for a noticeable time (answering LOADING).
func ballast(t *testing.T, addr string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	val := strings.Repeat("x", 256)
	for batch := range 40 {
		p := c.Pipeline()
		for i := range 5000 {
			p.Set(ctx, fmt.Sprintf("ballast:%d:%d", batch, i), val, 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatalf("writing the ballast: %v", err)
		}
	}
}

// sawLoading pings addr until it answers PONG (or within passes) and
// reports whether it answered LOADING on the way.
func sawLoading(addr string, within time.Duration) bool {
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	saw := false
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return saw
		}
		saw = saw || strings.HasPrefix(err.Error(), "LOADING")
	}
	return saw
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestARedisStoreRidesOutOnlyWithAnOutageGrace: --pool-outage-grace applies
// to a Redis lease store as to a lease API: above 0 the gateway keeps its
// last-known pool (and its outage gauge, 0 while Redis answers); 0 turns it
// off and the gateway leases from Redis directly, with no such gauge.
func TestARedisStoreRidesOutOnlyWithAnOutageGrace(t *testing.T) {
	rd := redis.Start(t, redis.Options{})
	for _, tc := range []struct {
		grace time.Duration
		gauge bool
	}{{time.Minute, true}, {0, false}} {
		cfg := testConfig()
		cfg.MetricsListen, cfg.AllowPrivateTargets = "127.0.0.1:0", true
		cfg.Static = []pool.Member{{Name: "d2", SourceAddr: netip.MustParseAddr("127.0.0.2")}}
		cfg.LeaseStore = leasestore.Config{URL: rd.URL(), Prefix: fmt.Sprintf("grace%d", tc.grace)}
		cfg.OutageGrace = tc.grace
		g := startGateway(t, cfg)
		plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
		_, body := daemontest.Get(t, plain, "http://"+g.Metrics+"/metrics")
		if got := strings.Contains(body, "proxyfleet_gateway_pool_outage 0"); got != tc.gauge {
			t.Errorf("outage grace %s: the last-known pool's gauge shown %v, want %v:\n%s", tc.grace, got, tc.gauge, grepLines(body, "pool_outage"))
		}
	}
}
