package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestPoolRecyclesAProxyThatSitesBanned is spec.recycle end to end: the
// real controller on a shared Redis lease store (a real redis-server), a
// ProxyPool of two External Proxies at a real Squid, and a real --lease-api
// gateway through which a crawler reaches three sites that answer 403. The
// gateway reports each ban to the controller's lease API; the Proxy three
// sites banned is recycled (a replacement comes up, it is drained and
// deleted), the one two sites banned stays, and the pool's status and the
// controller's metric count the one recycle.
func TestPoolRecyclesAProxyThatSitesBanned(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	rdb := redis.Start(t, redis.Options{})
	squid := startSquids(t, "recycle", "127.0.0.233")[0]
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	var sites []*testutil.Target
	for _, host := range []string{"127.0.0.230", "127.0.0.231", "127.0.0.232"} {
		s := testutil.StartTarget(t, testutil.TargetOptions{Host: host})
		s.SetRule(squid.OutgoingAddr(), http.StatusForbidden, nil)
		sites = append(sites, s)
	}
	const token = "e2e-recycle-lease-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, token+"\n")
	ctl := startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--lease-store", rdb.URL(),
		"--health-tick", "100ms", "--recycle-interval", "200ms", "--pool-drain-poll", "200ms")

	pool := gen.ProxyPool("burnt", gen.SetProxyPoolNamespace(ns), gen.SetProxyPoolReplicas(2), gen.SetProxyPoolDrainSeconds(3),
		gen.SetProxyPoolRecycle(v1alpha1.PoolRecycle{BannedSites: 3, Window: &metav1.Duration{Duration: time.Hour}}),
		gen.SetProxyPoolTemplate(gen.Proxy("unused",
			gen.SetProxyEndpoint("127.0.0.1", int32(squid.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1})).Spec))
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	proxies := func() []v1alpha1.Proxy {
		var list v1alpha1.ProxyList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: "burnt"}); err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	getPool := func() *v1alpha1.ProxyPool {
		var p v1alpha1.ProxyPool
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "burnt"}, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	var before []v1alpha1.Proxy
	poll.Until(t, pollTimeout, "two Ready Proxies", func() error {
		before = proxies()
		p := getPool()
		return poll.Check(len(before) == 2 && p.Status.ReadyReplicas == 2, "%d Proxies, status %+v", len(before), p.Status)
	})
	burnt, warm := before[0].Name, before[1].Name

	gw := startGateway(t, bin, gwConfig{args: poolAPIArgs(t, "http://"+ctl.leaseAPIAddr, token)})
	c := gw.client(t, "", nil)
	crawl := func(member string, s *testutil.Target) {
		t.Helper()
		poll.Until(t, pollTimeout, member+" leased for "+s.Host(), func() error {
			r, err := doGet(c, s.URL()+"/page", http.Header{"X-Proxyfleet-Proxy": {ns + "/" + member}})
			if err != nil {
				return err
			}
			return poll.Check(r.status == http.StatusForbidden && r.source == squid.OutgoingAddr(), "%d from %q (%s)", r.status, r.source, r.reason)
		})
	}
	for _, s := range sites {
		crawl(burnt, s)
	}
	for _, s := range sites[:2] {
		crawl(warm, s)
	}

	poll.Until(t, pollTimeout, burnt+" recycled and replaced", func() error {
		ps, p := proxies(), getPool()
		names := make([]string, 0, len(ps))
		for _, px := range ps {
			names = append(names, px.Name)
		}
		return poll.Check(!slices.Contains(names, burnt) && slices.Contains(names, warm) && len(ps) == 2 &&
			p.Status.ReadyReplicas == 2 && p.Status.RecycledReplicas == 1, "%v, status %+v", names, p.Status)
	})
	// The condition is written by the pool's next reconcile after the
	// replacement, which may come after the counts above were seen.
	poll.Until(t, pollTimeout, "the Recycling condition NoneBanned, naming "+warm+" banned by two sites", func() error {
		cond := getPool().Condition(v1alpha1.ConditionRecycling)
		return poll.Check(cond != nil && cond.Reason == v1alpha1.ReasonNoneBanned && strings.Contains(cond.Message, warm+" by 2 sites"),
			"Recycling condition %+v", cond)
	})
	_, body, err := httpGet("http://" + ctl.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if want := `proxyfleet_pool_recycled_proxies_total{namespace="` + ns + `",pool="burnt"} 1`; !strings.Contains(body, want) {
		t.Errorf("controller /metrics lacks %s", want)
	}
}
