package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// The shared lease store as operators run it: standalone gateways (the
// real binary, --lease-store pointing at a real topology) sharing one
// Redis Sentinel or Redis Cluster, a crawl through both while the primary
// holding the fleet's keys is SIGKILLed. No client request fails; a ban
// learnt before the kill holds after it, seen by a gateway started after
// the failover (it has no memory of its own).

// failoverCrawl starts two per-request gateways on store (every request
// acquires and releases a lease in Redis), bans squids[0] on one site,
// crawls through both gateways from six clients while kill takes the
// primary away and waitNew waits for its successor, and then checks what
// the crawlers saw and that the ban survived. extra are more gateway flags.
func failoverCrawl(t *testing.T, bin string, squids []*squid.Squid, store, prefix string, siteAddr, bannedSiteAddr string, kill func(), waitNew func(), extra ...string) {
	t.Helper()
	args := append([]string{"--lease-store", store, "--lease-store-prefix", prefix}, extra...)
	gw := func() *gatewayProc {
		return startGateway(t, bin, gwConfig{rotation: "per-request", upstreams: squidURLs(squids), args: args})
	}
	gws := []*gatewayProc{gw(), gw()}
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: siteAddr})
	limited := testutil.StartTarget(t, testutil.TargetOptions{Host: bannedSiteAddr})
	banned := squids[0].OutgoingAddr()
	limited.SetRule(banned, http.StatusTooManyRequests, map[string]string{"Retry-After": "600"})
	c0 := gws[0].client(t, "", nil)
	poll.Until(t, 60*time.Second, "a request through the banned member", func() error {
		mustGet(t, c0, limited.URL()+"/ban", nil)
		if limited.Count(banned) == 0 {
			return fmt.Errorf("no request through %s yet", banned)
		}
		return nil
	})

	var clients []*http.Client
	for i := range 6 {
		clients = append(clients, gws[i%2].client(t, "", nil))
	}
	load := startCrawl(clients, site.URL()+"/crawl")
	load.waitSent(100)
	before := load.sent.Load()
	killed := time.Now()
	kill()
	waitNew()
	failover := time.Since(killed)
	after := load.sent.Load()
	load.waitSent(after + 300)
	load.end()
	t.Logf("%d requests (%d before the kill, %d during the %s failover), %d failed; slowest %dms",
		load.sent.Load(), before, after-before, failover.Round(time.Millisecond), load.failed.Load(), load.slowest.Load())
	load.wantNoFailure(t, "the failover", after, 300)

	fresh := gw()
	fc := fresh.client(t, "", nil)
	n := limited.Count(banned)
	for range 9 {
		mustGetOK(t, fc, limited.URL()+"/after-failover", nil)
	}
	if got := limited.Count(banned); got != n {
		t.Fatalf("after the failover the banned member carried %d more requests to the site that banned it", got-n)
	}
}

func TestGatewaysOnRedisSentinelRideOutAPrimaryKill(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "sentinel", "127.0.0.171", "127.0.0.172", "127.0.0.173")
	rs := redis.StartSentinel(t, redis.SentinelTopology{Password: "e2e-sentinel-pw"})
	old := rs.Primary(t)
	failoverCrawl(t, bin, squids, rs.URL(), "e2e-sentinel", "127.0.0.174", "127.0.0.175", func() {
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() { rs.WaitFailover(t, old, 60*time.Second) })
}

func TestGatewaysOnRedisClusterRideOutAPrimaryKill(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "cluster", "127.0.0.181", "127.0.0.182", "127.0.0.183")
	rc := redis.StartCluster(t, redis.ClusterTopology{})
	const prefix = "e2e-cluster"
	old := rc.PrimaryForKey(t, "{"+prefix+"}:")
	failoverCrawl(t, bin, squids, rc.URL(), prefix, "127.0.0.184", "127.0.0.185", func() {
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() { rc.WaitFailover(t, "{"+prefix+"}:", old, 60*time.Second) })
}

// TestGatewaysOnAShardedRedisClusterRideOutAPrimaryKill is the Cluster
// failover with the fleet's members in three groups (--lease-store-shards
// 3), each under a hash tag of its own on its own primary: the primary
// holding a group with members is killed mid-crawl, and no client request
// fails while its replica takes over.
func TestGatewaysOnAShardedRedisClusterRideOutAPrimaryKill(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "shardcluster", "127.0.0.236", "127.0.0.237", "127.0.0.238")
	rc := redis.StartCluster(t, redis.ClusterTopology{})
	const prefix = "e2e-shards"
	var key string
	var old *redis.Server
	failoverCrawl(t, bin, squids, rc.URL(), prefix, "127.0.0.242", "127.0.0.243", func() {
		// A group's members key (three members in three groups by a hash
		// of their names: some group may have none), wherever its tag put it.
		for _, n := range rc.Nodes {
			v, err := n.Do("KEYS", "{"+prefix+":s*}:members")
			if ks, _ := v.([]any); err == nil && len(ks) > 0 && key == "" {
				key = fmt.Sprint(ks[0])
			}
		}
		if key == "" {
			t.Fatal("no member group on the Cluster")
		}
		old = rc.PrimaryForKey(t, key)
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() { rc.WaitFailover(t, key, old, 60*time.Second) }, "--lease-store-shards", "3")
}

// A gateway on a rediss:// store with a CA and a client certificate serves;
// one given another CA does not start, and says which flag is wrong, with
// the password masked.
func TestGatewayOnTLSRedisVerifiesTheServer(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "tls", "127.0.0.191")
	ca := redis.NewCA(t, "e2e-redis-ca")
	client := ca.Issue(t, "client")
	r := redis.Start(t, redis.Options{Password: "e2e-tls-pw",
		TLS: &redis.TLS{CA: ca, Server: ca.Issue(t, "server"), Client: client, AuthClients: true}})
	gw := startGateway(t, bin, gwConfig{upstreams: squidURLs(squids), args: []string{"--lease-store", r.URL(),
		"--lease-store-ca-file", ca.CertFile, "--lease-store-cert-file", client.CertFile, "--lease-store-key-file", client.KeyFile}})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.192"})
	mustGetOK(t, gw.client(t, "", nil), site.URL()+"/tls", nil)
	if keys, err := r.Do("KEYS", "{proxyfleet}:members"); err != nil || len(keys.([]any)) != 1 {
		t.Fatalf("the gateway's members are not in the TLS Redis: %v %v", keys, err)
	}

	wrong := redis.NewCA(t, "e2e-wrong-ca")
	out, err := exec.Command(bin, "gateway", "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--upstream", squids[0].URL(),
		"--lease-store", r.URL(), "--lease-store-ca-file", wrong.CertFile,
		"--lease-store-cert-file", client.CertFile, "--lease-store-key-file", client.KeyFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--lease-store-ca-file "+wrong.CertFile) || !strings.Contains(string(out), "not trusted") {
		t.Fatalf("a gateway given the wrong CA: %v\n%s\nwant a refusal to start naming --lease-store-ca-file", err, out)
	}
	if strings.Contains(string(out), "e2e-tls-pw") {
		t.Fatalf("the refusal shows the password:\n%s", out)
	}
}

// TestControllerReplicasOnRedisSentinel runs two real controller replicas
// on a real Sentinel topology behind one --lease-api gateway whose
// last-known pool is off (--pool-outage-grace 0), so any lease API answer
// of 503 store_unavailable would reach a crawler. The primary is SIGKILLed
// mid-crawl: the replicas' store waits out the failover and no request
// fails.
func TestControllerReplicasOnRedisSentinel(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	rs := redis.StartSentinel(t, redis.SentinelTopology{})
	squids := startSquids(t, "ctl-sentinel", "127.0.0.176", "127.0.0.177", "127.0.0.178")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	const apiToken = "e2e-sentinel-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, apiToken+"\n")
	var ctls []*controllerProc
	for range 2 {
		ctls = append(ctls, startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--health-tick", "100ms",
			"--lease-store", rs.URL(), "--lease-store-prefix", "e2e-ctl", "--leader-elect", "--leader-election-namespace", ns))
	}
	var names []string
	for i, sq := range squids {
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names = append(names, ns+"/"+px.Name)
	}
	var urls []string
	for _, ctl := range ctls {
		api, err := leaseapi.NewClient("http://"+ctl.leaseAPIAddr, apiToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		poll.Until(t, pollTimeout, "replica "+ctl.leaseAPIAddr+" offering the three Proxies", func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
		})
		urls = append(urls, "http://"+ctl.leaseAPIAddr)
	}
	gw := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolAPIArgs(t, strings.Join(urls, ","), apiToken, "--pool-outage-grace", "0")})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.179"})

	load := startCrawl([]*http.Client{gw.client(t, "", nil), gw.client(t, "", nil), gw.client(t, "", nil), gw.client(t, "", nil)}, site.URL()+"/crawl")
	load.waitSent(100)
	old := rs.Primary(t)
	before, killed := load.sent.Load(), time.Now()
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	rs.WaitFailover(t, old, 60*time.Second)
	failover := time.Since(killed)
	after := load.sent.Load()
	load.waitSent(after + 300)
	load.end()
	t.Logf("%d requests (%d before the kill, %d during the %s failover), %d failed",
		load.sent.Load(), before, after-before, failover.Round(time.Millisecond), load.failed.Load())
	load.wantNoFailure(t, "the failover", after, 300)
}
