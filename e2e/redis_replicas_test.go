package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// TestControllerReplicasOnRedis runs two real controller processes on one
// real redis-server behind one --lease-api gateway that knows both. One
// replica is SIGKILLed in the middle of a crawl and no client request
// fails; a ban learnt through the gateway then outlives restarting both
// replicas, because it lives in Redis, not in a process.
func TestControllerReplicasOnRedis(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	rdb := redis.Start(t, redis.Options{})

	squids := startSquids(t, "replicas", "127.0.0.131", "127.0.0.132", "127.0.0.133")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	const apiToken = "e2e-replicas-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, apiToken+"\n")
	replica := func() *controllerProc {
		return startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--health-tick", "100ms",
			"--lease-store", rdb.URL(), "--leader-elect", "--leader-election-namespace", ns)
	}
	ctlA, ctlB := replica(), replica()

	var names []string
	for i, sq := range squids {
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names = append(names, ns+"/"+px.Name)
	}
	for i := range squids {
		waitProxy(t, env.Client, ns, fmt.Sprintf("squid-%d", i), "Ready and Healthy", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
		})
	}
	for _, ctl := range []*controllerProc{ctlA, ctlB} {
		api, err := leaseapi.NewClient("http://"+ctl.leaseAPIAddr, apiToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		poll.Until(t, pollTimeout, "replica "+ctl.leaseAPIAddr+" offering the three Proxies", func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
		})
	}
	both := "http://" + ctlA.leaseAPIAddr + ",http://" + ctlB.leaseAPIAddr
	gw := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolAPIArgs(t, both, apiToken)})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.134"})

	t.Run("a replica killed mid-crawl fails no request", func(t *testing.T) {
		c := gw.client(t, "", nil)
		load := startCrawl([]*http.Client{c, c, c, c}, site.URL()+"/crawl")
		load.waitSent(50)
		if err := ctlA.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		before := load.sent.Load()
		load.waitSent(before + 200)
		load.end()
		load.wantNoFailure(t, "the replica's death", before, 200)
	})

	var ctlC, ctlD *controllerProc
	t.Run("a ban outlives restarting every replica", func(t *testing.T) {
		banned := squids[0].OutgoingAddr()
		limited := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.135"})
		limited.SetRule(banned, http.StatusTooManyRequests, map[string]string{"Retry-After": "600"})
		c := gw.client(t, "", nil)
		poll.Until(t, 60*time.Second, "a request through the banned member", func() error {
			mustGet(t, c, limited.URL()+"/ban", nil)
			if limited.Count(banned) == 0 {
				return fmt.Errorf("no request through %s yet", banned)
			}
			return nil
		})
		// Every replica goes; two new ones start on the same Redis.
		if _, err := ctlB.Stop(); err != nil {
			t.Fatal(err)
		}
		ctlC, ctlD = replica(), replica()
		api, err := leaseapi.NewClient("http://"+ctlC.leaseAPIAddr, apiToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		poll.Until(t, pollTimeout, "the restarted replicas offering the three Proxies", func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
		})
		after := startGateway(t, bin, gwConfig{rotation: "per-request",
			args: poolAPIArgs(t, "http://"+ctlC.leaseAPIAddr+",http://"+ctlD.leaseAPIAddr, apiToken)})
		ac := after.client(t, "", nil)
		n := limited.Count(banned)
		for range 9 {
			mustGetOK(t, ac, limited.URL()+"/after-restart", nil)
		}
		if got := limited.Count(banned); got != n {
			t.Fatalf("after restarting both replicas the banned member carried %d more requests to the site that banned it", got-n)
		}
		// The ban is for that site only: the member still serves others.
		other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.136"})
		for range 6 {
			mustGetOK(t, ac, other.URL()+"/other", nil)
		}
		if got := other.Sources(); !slices.Contains(got, banned) {
			t.Fatalf("after the restart the banned member served no other site: %v", got)
		}
	})

	t.Run("with Redis stopped held leases keep working, new sessions ride on the last-known members", func(t *testing.T) {
		if ctlC == nil {
			t.Fatal("the previous subtest did not start the restarted replicas this one uses")
		}
		apis := "http://" + ctlC.leaseAPIAddr + ",http://" + ctlD.leaseAPIAddr
		sticky := startGateway(t, bin, gwConfig{args: poolAPIArgs(t, apis, apiToken, "--lease-ttl", "5m")})
		// With its last-known pool off, a gateway passes the replicas'
		// store_unavailable on.
		strict := startGateway(t, bin, gwConfig{args: poolAPIArgs(t, apis, apiToken, "--lease-ttl", "5m", "--pool-outage-grace", "0")})
		c := sticky.client(t, "crawler-session-held", nil)
		pinned := mustGetOK(t, c, site.URL()+"/pin", nil)
		poll.Until(t, 30*time.Second, "the last-known member list", func() error {
			// The last-known list arrives with the first refresh.
			var v statuspage.GatewayView
			getJSON(t, "http://"+sticky.metricsAddr+statuspage.JSONPath, &v)
			if v.LastKnown == nil || v.LastKnown.Members == 0 {
				return fmt.Errorf("no last-known list yet: %+v", v.LastKnown)
			}
			return nil
		})
		if err := rdb.Stop(); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if r := mustGetOK(t, c, site.URL()+"/held", nil); r.proxy != pinned.proxy {
				t.Fatalf("the held session moved from %s to %s while Redis was down", pinned.proxy, r.proxy)
			}
		}
		mustGetOK(t, sticky.client(t, "crawler-session-new", nil), site.URL()+"/new", nil)
		fresh := strict.client(t, "crawler-session-new", nil)
		r := mustGet(t, fresh, site.URL()+"/new", nil)
		if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "store_unavailable") {
			t.Fatalf("a new session with Redis down and no last-known pool: %d %s %q, want 503 naming store_unavailable", r.status, r.reason, r.body)
		}
		rdb.Start()
		poll.Until(t, 60*time.Second, "a new session after Redis came back", func() error {
			r, err := doGet(fresh, site.URL()+"/back", nil)
			if err != nil {
				return err
			}
			if r.status != http.StatusOK {
				return fmt.Errorf("%d %s %s", r.status, r.reason, strings.TrimSpace(r.body))
			}
			return nil
		})
	})
}
