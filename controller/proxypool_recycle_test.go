package controller

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestDecideRecycle(t *testing.T) {
	sites := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("site-%d.com", i))
		}
		return out
	}
	tests := []struct {
		name        string
		members     []recycleMember
		wantReplace []string
		wantReason  string
		wantInMsg   []string
	}{
		{"none banned", []recycleMember{{Name: "a"}, {Name: "b"}}, nil, v1alpha1.ReasonNoneBanned,
			[]string{"no Proxy was banned or rate-limited by 3 or more sites within 1h0m0s"}},
		{"fewer sites than the threshold: the most banned is named", []recycleMember{{Name: "a", Sites: sites(2)}, {Name: "b", Sites: sites(1)}},
			nil, v1alpha1.ReasonNoneBanned, []string{"the most: a by 2 sites (site-0.com, site-1.com)"}},
		{"exactly the threshold recycles", []recycleMember{{Name: "a", Sites: sites(3)}, {Name: "b", Sites: sites(2)}},
			[]string{"a"}, v1alpha1.ReasonRecyclingBanned, []string{"recycling 1 Proxies", "a by 3 sites (site-0.com, site-1.com, site-2.com)"}},
		{"every burnt member, the message bounded", []recycleMember{{Name: "a", Sites: sites(9)}, {Name: "b", Sites: sites(4)}, {Name: "c", Sites: sites(3)}, {Name: "d", Sites: sites(3)}},
			[]string{"a", "b", "c", "d"}, v1alpha1.ReasonRecyclingBanned, []string{"recycling 4 Proxies", "a by 9 sites (site-0.com, site-1.com, site-2.com, site-3.com, site-4.com, ...)", "and 1 more"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decideRecycle(3, time.Hour, tt.members)
			var got []string
			for n := range d.Replace {
				got = append(got, n)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.wantReplace) || d.Reason != tt.wantReason {
				t.Fatalf("decideRecycle = %v %q (%s), want %v %q", got, d.Reason, d.Message, tt.wantReplace, tt.wantReason)
			}
			for _, w := range tt.wantInMsg {
				if !strings.Contains(d.Message, w) {
					t.Errorf("message %q lacks %q", d.Message, w)
				}
			}
		})
	}
}

func TestBannedSitesCountsDistinctSitesOfThePoolsNamespace(t *testing.T) {
	bans := []pool.Cooldown{
		{Member: "ns/a", Target: "shop.com", Reason: rotation.ResultBanned},
		{Member: "ns/a", Target: "news.com", Reason: rotation.ResultRateLimited},
		{Member: "ns/a", Target: "shop.com", Reason: rotation.ResultRateLimited},
		{Member: "ns/a", Target: "dead.com", Reason: rotation.ResultTargetUnreachable},
		{Member: "ns/a", Target: "", Reason: rotation.ResultBanned},
		{Member: "other/a", Target: "maps.com", Reason: rotation.ResultBanned},
		{Member: "ns/b", Target: "maps.com", Reason: rotation.ResultBanned},
	}
	got := bannedSites(bans, "ns")
	if want := map[string][]string{"a": {"news.com", "shop.com"}, "b": {"maps.com"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("bannedSites = %v, want %v", got, want)
	}
}

// countingRecycles is a RecycleRecorder that counts per pool.
type countingRecycles struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingRecycles) Recycled(namespace, pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[namespace+"/"+pool]++
}

func (c *countingRecycles) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// TestProxyPoolRecyclesAProxyBannedByEnoughSites runs a pool with
// spec.recycle {bannedSites: 3} on the in-memory lease store and on a
// shared Redis store (a real redis-server): bans are reported through the
// lease API as a gateway reports them. The Proxy banned by three sites is
// replaced, its replacement first (never more than replicas + maxSurge, never
// fewer Ready than replicas), and drained: it stays while a lease on it
// runs; the one banned by two is kept.
func TestProxyPoolRecyclesAProxyBannedByEnoughSites(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			setup := poolSetup{comingUp: 300 * time.Millisecond, recycles: &countingRecycles{}}
			if store == "redis" {
				r := redis.Start(t, redis.Options{})
				rs, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: r.URL(), Prefix: "recycle"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rs.Close() })
				setup.backend = rs
			}
			testRecycle(t, setup)
		})
	}
}

func testRecycle(t *testing.T, setup poolSetup) {
	ph := startPool(t, setup)
	ph.newPool("burnt", 3, func(p *v1alpha1.ProxyPool) {
		p.Spec.Recycle = &v1alpha1.PoolRecycle{BannedSites: 3, Window: &metav1.Duration{Duration: time.Hour}}
		p.Spec.MaxSurge, p.Spec.MaxUnavailable = ptr32(1), ptr32(1)
		p.Spec.DrainSeconds = ptr32(600) // only the lease ending ends the drain
	})
	_, before := ph.waitPool("burnt", "3 Ready", settled(3))
	stop := ph.watchInvariant("burnt", func(ps []v1alpha1.Proxy) string {
		if n := len(live(ps)); n > 4 {
			return fmt.Sprintf("%d Proxies in service or coming up, above replicas+maxSurge 4", n)
		}
		if n := readyCount(ps); n < 3 {
			return fmt.Sprintf("%d Ready, below replicas 3: a recycle with maxSurge 1 brings the replacement up first", n)
		}
		return ""
	})
	defer stop()
	burnt, warm := before[0], before[1]
	// A gateway reports each site's ban on a lease of that member for that site.
	ban := func(px v1alpha1.Proxy, site string, result rotation.Result) {
		t.Helper()
		l, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Proxy: ph.ns + "/" + px.Name, Target: site, TTL: 10 * time.Minute})
		if err != nil {
			t.Fatalf("lease on %s for %s: %v", px.Name, site, err)
		}
		if err := ph.leases.Report(ph.ctx(), l.ID, pool.Report{Result: result}); err != nil {
			t.Fatalf("report %s on %s: %v", result, px.Name, err)
		}
		if err := ph.leases.Release(ph.ctx(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	ban(warm, "shop.com", rotation.ResultBanned)
	ban(warm, "news.com", rotation.ResultRateLimited)
	// The burnt one keeps a crawler's lease on a site that still takes it.
	held := ph.lease(&burnt)
	ban(burnt, "shop.com", rotation.ResultBanned)
	ban(burnt, "news.com", rotation.ResultRateLimited)
	ban(burnt, "maps.com", rotation.ResultBanned)

	_, ps := ph.waitPool("burnt", burnt.Name+" draining to be recycled, its replacement Ready", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		i := slices.IndexFunc(ps, func(px v1alpha1.Proxy) bool { return px.Name == burnt.Name })
		return i >= 0 && ps[i].IsDraining() && len(live(ps)) == 3 && readyCount(ps) == 3 && p.Status.RecycledReplicas == 1
	})
	drained := ps[slices.IndexFunc(ps, func(px v1alpha1.Proxy) bool { return px.Name == burnt.Name })]
	if note := drained.Annotations[v1alpha1.AnnotationRecycled]; !strings.Contains(note, "3 sites (maps.com, news.com, shop.com)") {
		t.Errorf("%s annotation %q does not say which sites banned it", v1alpha1.AnnotationRecycled, note)
	}
	p := ph.getPool("burnt")
	if c := p.Condition(v1alpha1.ConditionRecycling); c == nil || c.Reason != v1alpha1.ReasonRecyclingBanned ||
		!strings.Contains(c.Message, burnt.Name) || !strings.Contains(c.Message, "3 sites (maps.com, news.com, shop.com)") {
		t.Errorf("Recycling condition %+v, want RecyclingBanned naming %s and its sites", c, burnt.Name)
	}
	if p.Status.LastRecycleTime == nil {
		t.Error("status.lastRecycleTime unset after a recycle")
	}
	// The drain holds while the lease runs.
	time.Sleep(time.Second)
	if ps := ph.proxies("burnt"); !slices.Contains(proxyNames(ps), burnt.Name) {
		t.Fatalf("%s deleted while a lease on it was active: %s", burnt.Name, describePool(ph.getPool("burnt"), ps))
	}
	if err := ph.leases.Release(ph.ctx(), held.ID); err != nil {
		t.Fatal(err)
	}
	p, after := ph.waitPool("burnt", burnt.Name+" deleted once its lease ended", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionRecycling)
		return settled(3)(p, ps) && !slices.Contains(proxyNames(ps), burnt.Name) && c != nil && c.Reason == v1alpha1.ReasonNoneBanned
	})
	if !slices.Contains(proxyNames(after), warm.Name) {
		t.Errorf("%s, banned by two sites of the three that recycle, was replaced too", warm.Name)
	}
	if c := p.Condition(v1alpha1.ConditionRecycling); !strings.Contains(c.Message, warm.Name+" by 2 sites") {
		t.Errorf("Recycling message %q does not name the most banned Proxy left", c.Message)
	}
	if p.Status.RecycledReplicas != 1 {
		t.Errorf("status.recycledReplicas = %d, want 1", p.Status.RecycledReplicas)
	}
	if n := setup.recycles.(*countingRecycles).count(ph.ns + "/burnt"); n != 1 {
		t.Errorf("recycle metric counted %d, want 1", n)
	}
}
