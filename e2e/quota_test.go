package e2e

import (
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestATokenClientsQuotaHoldsAcrossGatewayProcessesOnOneRedis: two
// `proxyfleet gateway` processes on one real redis-server, in front of
// the same two Squids, with one --auth-token-file: client a may send 10
// requests per second, client b has no quota. a loads both gateways at
// once for 5 s and is held to its quota over the two together (answered
// 429 quota_exceeded past it), while b, loading them too, is never
// refused. The figures are in the log.
func TestATokenClientsQuotaHoldsAcrossGatewayProcessesOnOneRedis(t *testing.T) {
	bin := testutil.BuildBinary(t)
	const (
		rps     = 10
		loadFor = 5 * time.Second
	)
	squids := startSquids(t, "quota", "127.0.0.226", "127.0.0.227")
	rdb := redis.Start(t, redis.Options{})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.228"})
	tokens := filepath.Join(t.TempDir(), "clients")
	writeFile(t, tokens, "# the e2e clients\na tok-a all rps=10\nb tok-b all\n")
	cfg := gwConfig{upstreams: squidURLs(squids), rotation: "per-request",
		args: []string{"--auth-token-file", tokens, "--lease-store", rdb.URL(), "--lease-store-prefix", "e2e-quota"}}
	gws := []*gatewayProc{startGateway(t, bin, cfg), startGateway(t, bin, cfg)}

	var a, b tally
	start := time.Now()
	var wg sync.WaitGroup
	load(gws, site.URL(), "tok-a", 6, loadFor, &a, &wg)
	load(gws, site.URL(), "tok-b", 4, loadFor, &b, &wg)
	wg.Wait()
	took := time.Since(start).Seconds()
	t.Logf("client a (rps=%d) through two gateway processes on one redis, %.1fs: %d served (%.1f/s), %d refused 429 quota_exceeded, %d other",
		rps, took, a.ok.Load(), float64(a.ok.Load())/took, a.refused.Load(), a.other.Load())
	t.Logf("client b (no quota) meanwhile: %d served (%.1f/s), %d refused, %d other", b.ok.Load(), float64(b.ok.Load())/took, b.refused.Load(), b.other.Load())

	if limit := int64(rps*took) + rps; a.ok.Load() > limit || a.ok.Load() < rps {
		t.Errorf("client a was served %d in %.1fs: want %d (its burst) to %d (its quota over both gateways)", a.ok.Load(), took, rps, limit)
	}
	if a.refused.Load() == 0 {
		t.Error("client a was never refused: the load did not reach its quota")
	}
	if b.refused.Load() != 0 || b.other.Load() != 0 || a.other.Load() != 0 {
		t.Errorf("unexpected answers: b refused %d, b other %d, a other %d", b.refused.Load(), b.other.Load(), a.other.Load())
	}
	if b.ok.Load() <= a.ok.Load() {
		t.Errorf("client b, without a quota, was served %d, no more than client a's %d", b.ok.Load(), a.ok.Load())
	}
}

// tally counts a load's answers: served, refused 429 quota_exceeded (with
// Retry-After), anything else.
type tally struct{ ok, refused, other atomic.Int64 }

// load sends GETs for site through gws (worker i through gws[i%len]) as
// the token client of token, with workers workers for d, counting in tl.
func load(gws []*gatewayProc, site, token string, workers int, d time.Duration, tl *tally, wg *sync.WaitGroup) {
	deadline := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			proxy := &url.URL{Scheme: "http", Host: gws[w%len(gws)].addr, User: url.UserPassword("crawler", token)}
			c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 30 * time.Second}
			for time.Now().Before(deadline) {
				resp, err := c.Get(site + "/q")
				if err != nil {
					tl.other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200:
					tl.ok.Add(1)
				case resp.StatusCode == 429 && resp.Header.Get("X-Proxyfleet-Reason") == "quota_exceeded" && resp.Header.Get("Retry-After") != "":
					tl.refused.Add(1)
					time.Sleep(10 * time.Millisecond)
				default:
					tl.other.Add(1)
				}
			}
		})
	}
}

// TestATokenClientsQuotaHoldsAcrossLeaseAPIGateways: the same through two
// gateways on --lease-api (as the chart's shared gateway's replicas run),
// the lease API a third gateway's (--lease-api-listen) on a store of its
// own: the API keeps the quota, so it holds over both.
func TestATokenClientsQuotaHoldsAcrossLeaseAPIGateways(t *testing.T) {
	bin := testutil.BuildBinary(t)
	const (
		rps     = 10
		loadFor = 5 * time.Second
	)
	squids := startSquids(t, "quotaapi", "127.0.0.221", "127.0.0.222")
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.223"})
	api := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), api: true})
	tokens := filepath.Join(t.TempDir(), "clients")
	writeFile(t, tokens, "a tok-a all rps=10\nb tok-b all\n")
	cfg := gwConfig{rotation: "per-request", args: poolAPIArgs(t, "http://"+api.apiAddr, api.apiToken, "--auth-token-file", tokens)}
	gws := []*gatewayProc{startGateway(t, bin, cfg), startGateway(t, bin, cfg)}

	var a, b tally
	start := time.Now()
	var wg sync.WaitGroup
	load(gws, site.URL(), "tok-a", 6, loadFor, &a, &wg)
	load(gws, site.URL(), "tok-b", 4, loadFor, &b, &wg)
	wg.Wait()
	took := time.Since(start).Seconds()
	t.Logf("client a (rps=%d) through two --lease-api gateways, %.1fs: %d served (%.1f/s), %d refused 429 quota_exceeded, %d other",
		rps, took, a.ok.Load(), float64(a.ok.Load())/took, a.refused.Load(), a.other.Load())
	t.Logf("client b (no quota) meanwhile: %d served (%.1f/s), %d refused, %d other", b.ok.Load(), float64(b.ok.Load())/took, b.refused.Load(), b.other.Load())
	if limit := int64(rps*took) + rps; a.ok.Load() > limit || a.ok.Load() < rps {
		t.Errorf("client a was served %d in %.1fs: want %d (its burst) to %d (its quota over both gateways)", a.ok.Load(), took, rps, limit)
	}
	if a.refused.Load() == 0 || b.refused.Load() != 0 || b.other.Load() != 0 || a.other.Load() != 0 {
		t.Errorf("answers: a refused %d, other %d; b refused %d, other %d", a.refused.Load(), a.other.Load(), b.refused.Load(), b.other.Load())
	}
}
