package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/scale"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

// healthyByDefault is the health source of pool tests: every Proxy the pool
// creates (under a generated name) turns Healthy comingUpFor after the
// engine is first asked about it (no verdict until then, as for a real
// Proxy coming up), unless the test set a verdict for it with set.
type healthyByDefault struct {
	fakeHealth
	comingUpFor time.Duration

	seenMu sync.Mutex
	seen   map[types.NamespacedName]time.Time
}

func (h *healthyByDefault) Snapshot(key types.NamespacedName) (HealthSnapshot, bool) {
	if s, ok := h.fakeHealth.Snapshot(key); ok {
		return s, true
	}
	h.seenMu.Lock()
	defer h.seenMu.Unlock()
	if h.seen == nil {
		h.seen = map[types.NamespacedName]time.Time{}
	}
	first, ok := h.seen[key]
	if !ok {
		first = time.Now()
		h.seen[key] = first
	}
	if time.Since(first) < h.comingUpFor {
		return HealthSnapshot{}, true
	}
	return HealthSnapshot{Known: true, Healthy: true, Message: "probe ok", Latency: time.Millisecond, CheckedAt: time.Now()}, true
}

// poolHarness is the Proxy reconciler (fake provider, test health) plus the
// ProxyPool reconciler and the real lease API on one manager.
type poolHarness struct {
	*harness
	health *healthyByDefault
	api    *leases.API
	leases *leaseapi.Client
	scales scale.ScalesGetter
}

// poolSetup tunes a pool harness.
type poolSetup struct {
	store    pool.StoreOptions
	backend  pool.LeaseStore // the lease API's store (a shared Redis one); nil: in memory from store
	noLeases bool            // no lease API: the pool sees no leases
	recycles RecycleRecorder // counts recycles, when set
	comingUp time.Duration   // how long a new Proxy has no health verdict
	skew     time.Duration   // how far the pool reconciler's clock runs ahead of the API server's
	// providers replace the fake provider (setup.providers).
	providers map[string]providers.Provider
}

// skewedClock is the real clock moved by skew: a controller on a node whose
// clock is not the control plane's.
type skewedClock struct{ skew time.Duration }

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func startPool(t *testing.T, o poolSetup) *poolHarness {
	t.Helper()
	ph := &poolHarness{health: &healthyByDefault{comingUpFor: o.comingUp}}
	var err error
	if ph.scales, err = env.ScaleClient(); err != nil {
		t.Fatal(err)
	}
	ph.harness = start(t, setup{
		providers: o.providers,
		health:    ph.health,
		onManager: func(h *harness, mgr manager.Manager) {
			pr := &ProxyPoolReconciler{
				Intervals:          PoolIntervals{DrainPoll: 50 * time.Millisecond, Autoscale: 100 * time.Millisecond, Recycle: 100 * time.Millisecond},
				Recycles:           o.recycles,
				SkipNameValidation: true,
			}
			if o.skew != 0 {
				pr.Clock = skewedClock{o.skew}
			}
			if !o.noLeases {
				api, err := leases.Setup(mgr, leases.Options{Listen: "127.0.0.1:0", Store: o.store, Backend: o.backend, Logger: mgr.GetLogger()})
				if err != nil {
					t.Fatalf("lease API: %v", err)
				}
				ph.api = api
				pr.Leases, pr.Bans = api, api
				if ph.leases, err = leaseapi.NewClient("http://"+api.Addr().String(), "", nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := pr.SetupWithManager(mgr); err != nil {
				t.Fatalf("ProxyPool SetupWithManager: %v", err)
			}
		},
	})
	return ph
}

// newPool is a pool of Managed Proxies on the fake provider with attributes
// pool=<name>, which lease selectors in these tests match.
func (ph *poolHarness) newPool(name string, replicas int32, edit func(p *v1alpha1.ProxyPool)) *v1alpha1.ProxyPool {
	ph.t.Helper()
	p := gen.ProxyPool(name, gen.SetProxyPoolNamespace(ph.ns), gen.SetProxyPoolReplicas(replicas),
		gen.SetProxyPoolTemplateLabels(map[string]string{"team": "crawl"}), gen.SetProxyPoolTemplate(ph.managed("unused").Spec))
	p.Spec.Template.Spec.Attributes = map[string]string{"pool": name, "region": "eu"}
	if edit != nil {
		edit(p)
	}
	ph.create(p)
	return p
}

// getPool reads a pool from the API server.
func (ph *poolHarness) getPool(name string) *v1alpha1.ProxyPool {
	ph.t.Helper()
	var p v1alpha1.ProxyPool
	if err := env.Client.Get(ph.ctx(), types.NamespacedName{Namespace: ph.ns, Name: name}, &p); err != nil {
		ph.t.Fatalf("get pool %s: %v", name, err)
	}
	return &p
}

// proxies lists the pool's Proxies (by label) from the API server, sorted by name.
func (ph *poolHarness) proxies(poolName string) []v1alpha1.Proxy {
	ph.t.Helper()
	var list v1alpha1.ProxyList
	if err := env.Client.List(ph.ctx(), &list, client.InNamespace(ph.ns), client.MatchingLabels{v1alpha1.LabelPool: poolName}); err != nil {
		ph.t.Fatalf("list Proxies: %v", err)
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.Proxy) int { return strings.Compare(a.Name, b.Name) })
	return list.Items
}

// live is the pool's Proxies neither draining nor being deleted.
func live(ps []v1alpha1.Proxy) []v1alpha1.Proxy {
	var out []v1alpha1.Proxy
	for _, p := range ps {
		if p.DeletionTimestamp.IsZero() && !p.IsDraining() {
			out = append(out, p)
		}
	}
	return out
}

func readyCount(ps []v1alpha1.Proxy) int {
	n := 0
	for _, p := range live(ps) {
		if p.IsHealthy() {
			n++
		}
	}
	return n
}

func proxyNames(ps []v1alpha1.Proxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// waitPool waits until the pool's Proxies and status satisfy cond.
func (ph *poolHarness) waitPool(name, what string, cond func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool) (*v1alpha1.ProxyPool, []v1alpha1.Proxy) {
	ph.t.Helper()
	var p *v1alpha1.ProxyPool
	var ps []v1alpha1.Proxy
	poll.Until(ph.t, wait, name+": "+what, func() error {
		p, ps = ph.getPool(name), ph.proxies(name)
		return poll.Check(cond(p, ps), "%s", describePool(p, ps))
	})
	return p, ps
}

// settled: spec.replicas Proxies, all Ready, nothing draining, status caught up.
func settled(want int) func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
	return func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return len(ps) == want && readyCount(ps) == want && p.Status.ReadyReplicas == int32(want) &&
			p.Status.Replicas == int32(want) && p.Status.ObservedGeneration == p.Generation
	}
}

func describePool(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "spec.replicas=%d status=%+v proxies:", p.Replicas(), p.Status)
	for _, px := range ps {
		fmt.Fprintf(&b, " [%s healthy=%v draining=%v deleting=%v hash=%s]", px.Name, px.IsHealthy(), px.IsDraining(),
			!px.DeletionTimestamp.IsZero(), px.Labels[v1alpha1.LabelPoolTemplateHash])
	}
	return b.String()
}

// scaleTo is kubectl scale pxp/<name> --replicas=n, through the Scale client.
func (ph *poolHarness) scaleTo(name string, n int32) {
	ph.t.Helper()
	gr := schema.GroupResource{Group: v1alpha1.Group, Resource: "proxypools"}
	poll.Until(ph.t, wait, fmt.Sprintf("scale %s to %d", name, n), func() error {
		s, err := ph.scales.Scales(ph.ns).Get(ph.ctx(), gr, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Replicas = n
		if _, err := ph.scales.Scales(ph.ns).Update(ph.ctx(), gr, s, metav1.UpdateOptions{}); err != nil {
			return err
		}
		return nil
	})
}

// lease acquires a lease pinned to one Proxy through the real lease API.
func (ph *poolHarness) lease(px *v1alpha1.Proxy) pool.Lease {
	ph.t.Helper()
	var l pool.Lease
	poll.Until(ph.t, wait, "lease on "+px.Name, func() error {
		var err error
		l, err = ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Proxy: ph.ns + "/" + px.Name, TTL: 10 * time.Minute})
		if err != nil {
			return err
		}
		return nil
	})
	return l
}

func TestProxyPoolCreatesOwnedProxiesFromTheTemplate(t *testing.T) {
	ph := startPool(t, poolSetup{})
	p := ph.newPool("eu", 3, nil)
	got, ps := ph.waitPool("eu", "3 Ready Proxies", settled(3))

	for _, px := range ps {
		if !strings.HasPrefix(px.Name, "eu-") {
			t.Errorf("Proxy %s is not named <pool>-<suffix>", px.Name)
		}
		ref := metav1.GetControllerOf(&px)
		if ref == nil || ref.UID != p.UID || ref.Kind != "ProxyPool" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("Proxy %s owner reference = %+v, want the pool as controller, blocking owner deletion", px.Name, ref)
		}
		if px.Labels[v1alpha1.LabelPool] != "eu" || px.Labels["team"] != "crawl" || px.Labels[v1alpha1.LabelPoolTemplateHash] == "" {
			t.Errorf("Proxy %s labels = %v, want the pool's, the template's and the template hash", px.Name, px.Labels)
		}
		if px.Spec.Attributes["region"] != "eu" || px.Spec.Provider != fakeName {
			t.Errorf("Proxy %s spec = %+v, want the template's", px.Name, px.Spec)
		}
	}
	if got.Status.Selector != v1alpha1.LabelPool+"=eu" || got.Status.DesiredReplicas != 3 ||
		!meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
		t.Errorf("status = %+v, want selector, desired 3 and Ready", got.Status)
	}
	// One instance per Proxy: a Proxy reconciled again before the cache
	// shows its providerID repeats its Create under the same name, which
	// the contract makes find the same instance, so names are counted.
	names := map[string]bool{}
	for _, req := range ph.fake.Creates() {
		names[req.Name] = true
	}
	if len(names) != 3 {
		t.Errorf("provider created %d instances (%v), want 3 (one per Proxy)", len(names), names)
	}
}

func TestProxyPoolScalesThroughTheScaleSubresourceInRemovalOrder(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("eu", 2, func(p *v1alpha1.ProxyPool) { p.Spec.DrainSeconds = ptr32(600) })
	ph.waitPool("eu", "2 Ready", settled(2))

	ph.scaleTo("eu", 5)
	_, ps := ph.waitPool("eu", "5 Ready after scaling up", settled(5))

	// One Proxy unhealthy, one holding a lease, three idle: scaling to 2
	// removes the unhealthy one, then the oldest idle ones.
	sick, leased := ps[0], ps[1]
	ph.health.set(types.NamespacedName{Namespace: ph.ns, Name: sick.Name}, HealthSnapshot{Known: true, Healthy: false, Message: "probe failed", CheckedAt: time.Now()})
	ph.waitProxy(sick.Name, "unhealthy", func(p *v1alpha1.Proxy) bool { return unhealthy(p) })
	ph.lease(&leased)
	idle := slices.DeleteFunc(slices.Clone(ps), func(p v1alpha1.Proxy) bool { return p.Name == sick.Name || p.Name == leased.Name })
	slices.SortStableFunc(idle, func(a, b v1alpha1.Proxy) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	// Creation times have a one-second resolution, so among idle Proxies
	// created in the same second the name decides; mirror removalRank.
	slices.SortStableFunc(idle, func(a, b v1alpha1.Proxy) int {
		return removalRank(poolMember{Name: a.Name, Created: a.CreationTimestamp.Time, Ready: true, Updated: true},
			poolMember{Name: b.Name, Created: b.CreationTimestamp.Time, Ready: true, Updated: true})
	})
	wantRemoved := []string{sick.Name, idle[0].Name, idle[1].Name}
	wantKept := []string{leased.Name, idle[2].Name}
	slices.Sort(wantKept)

	ph.scaleTo("eu", 2)
	_, ps = ph.waitPool("eu", "2 left", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return len(ps) == 2 && p.Status.Replicas == 2
	})
	if got := proxyNames(ps); !slices.Equal(got, wantKept) {
		t.Errorf("kept %v, want %v (removed should be %v: unhealthy, then unleased oldest)", got, wantKept, wantRemoved)
	}
}

func TestProxyPoolDrainsALeasedProxyBeforeDeletingIt(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("eu", 1, func(p *v1alpha1.ProxyPool) { p.Spec.DrainSeconds = ptr32(600) })
	_, ps := ph.waitPool("eu", "1 Ready", settled(1))
	px := ps[0]
	l := ph.lease(&px)

	ph.scaleTo("eu", 0)
	ph.waitProxy(px.Name, "draining", func(p *v1alpha1.Proxy) bool { return p.IsDraining() })
	// New leases go elsewhere (here: nowhere), the held one runs on.
	poll.Until(ph.t, wait, "the lease API stops offering the draining Proxy", func() error {
		got, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Proxy: ph.ns + "/" + px.Name})
		if err == nil {
			// Offered before the lease source saw the annotation: give it
			// back, or it would hold the drain for drainSeconds.
			_ = ph.leases.Release(ph.ctx(), got.ID)
			return errors.New("still offered")
		}
		var nm *pool.NoMatchError
		return poll.Check(errors.As(err, &nm), "%v", err)
	})
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := ph.get(px.Name); err != nil {
			t.Fatalf("Proxy %s deleted while its lease was held and drainSeconds (600) not up: %v", px.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := ph.getPool("eu"); got.Status.DrainingReplicas != 1 || got.Status.Replicas != 0 {
		t.Errorf("status = %+v, want 1 draining, 0 replicas", got.Status)
	}

	if err := ph.leases.Release(ph.ctx(), l.ID); err != nil {
		t.Fatalf("release: %v", err)
	}
	ph.waitGone(px.Name)
	if !slices.Contains(ph.fake.Ops(), providers.OpDelete) {
		t.Errorf("the instance was not deleted with the Proxy: %s", ph.fake)
	}
}

func TestProxyPoolDeletesADrainingProxyWhenDrainSecondsAreUp(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("eu", 1, func(p *v1alpha1.ProxyPool) { p.Spec.DrainSeconds = ptr32(1) })
	_, ps := ph.waitPool("eu", "1 Ready", settled(1))
	px := ps[0]
	ph.lease(&px) // held, never released
	ph.scaleTo("eu", 0)
	drained := ph.waitProxy(px.Name, "draining", func(p *v1alpha1.Proxy) bool { return p.IsDraining() })
	since, _ := drained.DrainingSince()
	ph.waitGone(px.Name)
	if held := time.Since(since); held < time.Second {
		t.Errorf("deleted %s after draining, before drainSeconds (1s) were up", held)
	}
}

// TestProxyPoolGivesAHandSetDrainItsDrainSeconds pins that a pool member
// an operator drains by hand with a value that is no time (`draining=true`)
// is stamped with the time the pool saw it and waits for its leases like
// any drain: read as draining since the zero time, it was deleted at once,
// cutting the leases it held.
func TestProxyPoolGivesAHandSetDrainItsDrainSeconds(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("eu", 1, func(p *v1alpha1.ProxyPool) { p.Spec.DrainSeconds = ptr32(600) })
	_, ps := ph.waitPool("eu", "1 Ready", settled(1))
	px := ps[0]
	l := ph.lease(&px) // held
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationDraining+`":"true"}}}`))
	if err := env.Client.Patch(ph.ctx(), &px, patch); err != nil {
		t.Fatal(err)
	}
	stamped := ph.waitProxy(px.Name, "the hand-set drain stamped with a time", func(p *v1alpha1.Proxy) bool {
		since, draining := p.DrainingSince()
		return draining && !since.IsZero()
	})
	if since, _ := stamped.DrainingSince(); time.Since(since) > time.Minute {
		t.Errorf("stamped %s, want about now", since)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := ph.get(px.Name); err != nil {
			t.Fatalf("Proxy %s deleted while its lease was held and drainSeconds (600) not up: %v", px.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := ph.leases.Release(ph.ctx(), l.ID); err != nil {
		t.Fatalf("release: %v", err)
	}
	ph.waitGone(px.Name)
}

// watchInvariant samples the pool's Proxies until the test ends, failing it
// when check reports a violation.
func (ph *poolHarness) watchInvariant(name string, check func(ps []v1alpha1.Proxy) string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			var list v1alpha1.ProxyList
			if err := env.Client.List(ctx, &list, client.InNamespace(ph.ns), client.MatchingLabels{v1alpha1.LabelPool: name}); err == nil {
				if why := check(list.Items); why != "" {
					ph.t.Errorf("invariant broken: %s; %s", why, describePool(&v1alpha1.ProxyPool{}, list.Items))
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return func() { cancel(); wg.Wait() }
}

func TestProxyPoolRollsATemplateChangeWithinSurgeAndUnavailable(t *testing.T) {
	tests := []struct {
		name              string
		surge, unav       int32
		maxLive, minReady int
	}{
		{"surge 1, unavailable 0: a replacement Ready before an old one drains", 1, 0, 4, 3},
		{"surge 0, unavailable 1: one old one out at a time", 0, 1, 3, 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Replacements come up slowly, so the rollout has steps to watch.
			ph := startPool(t, poolSetup{comingUp: 300 * time.Millisecond})
			name := fmt.Sprintf("roll-%d", i)
			ph.newPool(name, 3, func(p *v1alpha1.ProxyPool) { p.Spec.MaxSurge, p.Spec.MaxUnavailable = ptr32(tc.surge), ptr32(tc.unav) })
			_, before := ph.waitPool(name, "3 Ready", settled(3))
			oldHash := before[0].Labels[v1alpha1.LabelPoolTemplateHash]

			stop := ph.watchInvariant(name, func(ps []v1alpha1.Proxy) string {
				if n := len(live(ps)); n > tc.maxLive {
					return fmt.Sprintf("%d Proxies in service or coming up, above replicas+maxSurge %d", n, tc.maxLive)
				}
				if n := readyCount(ps); n < tc.minReady {
					return fmt.Sprintf("%d Ready, below replicas-maxUnavailable %d", n, tc.minReady)
				}
				return ""
			})
			defer stop()
			p := ph.getPool(name)
			p.Spec.Template.Spec.Attributes["region"] = "eu-west"
			if err := env.Client.Update(ph.ctx(), p); err != nil {
				t.Fatalf("template change: %v", err)
			}
			_, after := ph.waitPool(name, "rolled to the new template", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
				if !settled(3)(p, ps) || p.Status.UpdatedReplicas != 3 {
					return false
				}
				for _, px := range ps {
					if px.Labels[v1alpha1.LabelPoolTemplateHash] == oldHash || px.Spec.Attributes["region"] != "eu-west" {
						return false
					}
				}
				return true
			})
			for _, old := range before {
				if slices.Contains(proxyNames(after), old.Name) {
					t.Errorf("old Proxy %s survived the rollout", old.Name)
				}
			}
		})
	}
}

func TestProxyPoolReplacesProxiesPastMaxAge(t *testing.T) {
	ph := startPool(t, poolSetup{comingUp: 300 * time.Millisecond})
	ph.newPool("fresh", 2, func(p *v1alpha1.ProxyPool) { p.Spec.MaxAge = &metav1.Duration{Duration: 3 * time.Second} })
	_, first := ph.waitPool("fresh", "2 Ready", settled(2))
	stop := ph.watchInvariant("fresh", func(ps []v1alpha1.Proxy) string {
		if n := readyCount(ps); n < 2 && len(ps) >= 2 {
			return fmt.Sprintf("%d Ready during the maxAge replacement, want 2 (maxSurge 1 replaces surge-first)", n)
		}
		return ""
	})
	defer stop()
	ph.waitPool("fresh", "both replaced by younger Proxies", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		if !settled(2)(p, ps) {
			return false
		}
		for _, px := range ps {
			if slices.Contains(proxyNames(first), px.Name) {
				return false
			}
		}
		return true
	})
}

func TestProxyPoolDeletionDeletesItsProxies(t *testing.T) {
	ph := startPool(t, poolSetup{})
	p := ph.newPool("gone", 2, nil)
	_, ps := ph.waitPool("gone", "2 Ready", settled(2))
	if err := env.Client.Delete(ph.ctx(), p); err != nil {
		t.Fatalf("delete pool: %v", err)
	}
	for _, px := range ps {
		ph.waitGone(px.Name)
	}
	poll.Until(ph.t, wait, "pool gone", func() error {
		err := env.Client.Get(ph.ctx(), client.ObjectKeyFromObject(p), &v1alpha1.ProxyPool{})
		return poll.Check(client.IgnoreNotFound(err) == nil && err != nil, "%v", err)
	})
	if n := ph.fake.Count(providers.OpDelete); n < 2 {
		t.Errorf("provider deletes = %d, want one per Proxy (the Proxies' finalizers were honoured)", n)
	}
}

func ptr32(v int32) *int32 { return &v }

// A pool whose Proxies the API server refuses to create (here a template
// label that is no valid label value; a ResourceQuota or an admission
// webhook refuse the same way) says so in its Ready condition, quoting the
// refusal: it only logged the error and said Scaling, for ever.
func TestProxyPoolSaysWhyItCannotCreateItsProxies(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("refused", 2, func(p *v1alpha1.ProxyPool) {
		p.Spec.Template.Metadata.Labels = map[string]string{"team": "crawl eu"}
	})
	p, ps := ph.waitPool("refused", "Ready=False FailedCreate", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonFailedCreate
	})
	if len(ps) != 0 {
		t.Errorf("Proxies %v exist, want none (the API server refuses them)", proxyNames(ps))
	}
	msg := p.Condition(v1alpha1.ConditionReady).Message
	for _, want := range []string{"0 of 2 Proxies Ready", "creating a Proxy failed", "metadata.labels", "crawl eu"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready message %q does not contain %q", msg, want)
		}
	}

	// Fixed, the pool creates its Proxies and the reason goes.
	poll.Until(t, wait, "fix the template", func() error {
		p := ph.getPool("refused")
		p.Spec.Template.Metadata.Labels = map[string]string{"team": "crawl-eu"}
		return env.Client.Update(ph.ctx(), p)
	})
	ph.waitPool("refused", "2 Ready, AllReady", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionReady)
		return settled(2)(p, ps) && c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAllReady
	})
}
