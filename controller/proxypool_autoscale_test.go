package controller

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// condition returns the pool's condition of type t as "Status/Reason: message".
func poolCondition(p *v1alpha1.ProxyPool, t string) string {
	c := meta.FindStatusCondition(p.Status.Conditions, t)
	if c == nil {
		return ""
	}
	return fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
}

// acquireFor leases n Proxies of the pool by its selector through the real lease API.
func (ph *poolHarness) acquireFor(poolName string, n int) []pool.Lease {
	ph.t.Helper()
	var out []pool.Lease
	for range n {
		l, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: map[string]string{"pool": poolName}, TTL: 10 * time.Minute})
		if err != nil {
			ph.t.Fatalf("acquire: %v", err)
		}
		out = append(out, l)
	}
	return out
}

func TestProxyPoolAutoscalesOnActiveLeasesWithinMinMaxAndAfterTheDelay(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.newPool("auto", 1, func(p *v1alpha1.ProxyPool) {
		p.Spec.DrainSeconds = ptr32(0)
		p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr32(1), MaxReplicas: 3, TargetLeasesPerProxy: 2, ScaleDownDelaySeconds: ptr32(2)}
	})
	ph.waitPool("auto", "1 Ready", settled(1))

	// 3 leases at 2 per Proxy need 2 Proxies.
	leases := ph.acquireFor("auto", 3)
	p, _ := ph.waitPool("auto", "scaled to 2 on leases", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 2 && settled(2)(p, ps)
	})
	if c := poolCondition(p, v1alpha1.ConditionAbleToScale); p.Status.LastScaleTime == nil ||
		!(meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionAbleToScale)) {
		t.Errorf("AbleToScale = %q, lastScaleTime %v; want True and a time", c, p.Status.LastScaleTime)
	}

	// 9 leases would need 5; maxReplicas is 3.
	leases = append(leases, ph.acquireFor("auto", 6)...)
	p, _ = ph.waitPool("auto", "clamped at maxReplicas 3", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 3 && settled(3)(p, ps) && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionScalingLimited)
	})
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionScalingLimited); c.Reason != v1alpha1.ReasonTooManyReplicas {
		t.Errorf("ScalingLimited = %q, want TooManyReplicas", poolCondition(p, v1alpha1.ConditionScalingLimited))
	}

	// All leases end: the size holds for scaleDownDelaySeconds, then falls
	// to minReplicas, never below.
	for _, l := range leases {
		if err := ph.leases.Release(ph.ctx(), l.ID); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	released := time.Now()
	p, _ = ph.waitPool("auto", "holding while the delay runs", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionAbleToScale)
		return c != nil && c.Reason == v1alpha1.ReasonScaleDownDelayed
	})
	if p.Replicas() != 3 || p.Status.ScaleDownSince == nil {
		t.Errorf("during the delay: replicas %d, scaleDownSince %v; want 3 and a time", p.Replicas(), p.Status.ScaleDownSince)
	}
	p, _ = ph.waitPool("auto", "down to minReplicas 1", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 1 && settled(1)(p, ps)
	})
	if since := p.Status.ScaleDownSince; since != nil {
		t.Errorf("scaleDownSince %v still set after scaling down", since)
	}
	if took := time.Since(released); took < 2*time.Second {
		t.Errorf("scaled down %s after the leases ended, before scaleDownDelaySeconds (2s)", took)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionScalingLimited); c == nil || c.Reason != v1alpha1.ReasonTooFewReplicas {
		t.Errorf("ScalingLimited = %q, want TooFewReplicas (no leases would need 0)", poolCondition(p, v1alpha1.ConditionScalingLimited))
	}
	// And it stays there.
	time.Sleep(500 * time.Millisecond)
	if got := ph.getPool("auto"); got.Replicas() != 1 {
		t.Errorf("replicas %d after settling, want minReplicas 1", got.Replicas())
	}
}

func TestProxyPoolAutoscalesOneStepUpOnRefusedLeaseRequests(t *testing.T) {
	// One lease per Proxy, so a second request is refused with 409 (at capacity).
	ph := startPool(t, poolSetup{store: pool.StoreOptions{MaxLeasesPerMember: 1}})
	ph.newPool("burst", 0, func(p *v1alpha1.ProxyPool) {
		p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr32(0), MaxReplicas: 2, TargetLeasesPerProxy: 100, ScaleDownDelaySeconds: ptr32(3600)}
	})
	refused := func() {
		t.Helper()
		_, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: map[string]string{"pool": "burst"}})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) {
			t.Fatalf("acquire = %v, want a 409", err)
		}
	}
	// asking is a crawler that keeps asking while it is refused, as crawlers
	// do: a refusal in the second a Proxy landed does not count (a landing
	// is known to the second only), the next one does. A request that is
	// served meanwhile gives its lease back.
	asking := func() {
		t.Helper()
		l, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: map[string]string{"pool": "burst"}})
		var nm *pool.NoMatchError
		switch {
		case err == nil:
			_ = ph.leases.Release(ph.ctx(), l.ID)
		case !errors.As(err, &nm):
			t.Errorf("acquire = %v, want a 409", err)
		}
	}
	// An empty pool: the request is refused, the pool gets its first Proxy.
	refused()
	ph.waitPool("burst", "1 Proxy after a refusal", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 1 && settled(1)(p, ps)
	})
	ph.acquireFor("burst", 1)
	refused()
	p, _ := ph.waitPool("burst", "2 Proxies after the next refusal", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		if p.Replicas() < 2 {
			asking()
		}
		return p.Replicas() == 2 && settled(2)(p, ps)
	})
	if c := poolCondition(p, v1alpha1.ConditionAbleToScale); !meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionAbleToScale) {
		t.Errorf("AbleToScale = %q", c)
	}
	// At maxReplicas a refusal changes nothing but says so.
	ph.acquireFor("burst", 1)
	refused()
	p, _ = ph.waitPool("burst", "limited at maxReplicas", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionScalingLimited)
		limited := c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonTooManyReplicas
		if !limited {
			asking()
		}
		return limited
	})
	if p.Replicas() != 2 {
		t.Errorf("replicas %d, want maxReplicas 2", p.Replicas())
	}
	// A request that would not match the pool does not grow it.
	_, _ = ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: map[string]string{"pool": "other"}})
	time.Sleep(500 * time.Millisecond)
	if got := ph.getPool("burst"); got.Replicas() != 2 {
		t.Errorf("replicas %d after an unrelated refusal, want 2", got.Replicas())
	}
}

// The lease API gives every member proxyfleet.io/namespace and
// proxyfleet.io/pool (docs/tenancy.md), and narrows a pod's requests to its
// namespace's share with them: a refused request naming the pool grows it,
// one narrowed to another namespace does not.
func TestProxyPoolAutoscalesOnRefusalsThatNameItsOwner(t *testing.T) {
	ph := startPool(t, poolSetup{})
	for _, tc := range []struct {
		name, pool string
		sel        func(ns string) map[string]string
		grows      bool
	}{
		{"a request naming the pool grows it", "named", func(string) map[string]string {
			return map[string]string{v1alpha1.LabelPool: "named"}
		}, true},
		{"a request narrowed to the pool's namespace grows it", "mine", func(ns string) map[string]string {
			return map[string]string{v1alpha1.AttributeNamespace: ns, "pool": "mine"}
		}, true},
		{"a request narrowed to another namespace does not", "theirs", func(string) map[string]string {
			return map[string]string{v1alpha1.AttributeNamespace: "another-team", "pool": "theirs"}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ph.newPool(tc.pool, 0, func(p *v1alpha1.ProxyPool) {
				p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr32(0), MaxReplicas: 1, TargetLeasesPerProxy: 100, ScaleDownDelaySeconds: ptr32(3600)}
			})
			_, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: tc.sel(ph.ns)})
			var nm *pool.NoMatchError
			if !errors.As(err, &nm) {
				t.Fatalf("acquire = %v, want a 409", err)
			}
			if tc.grows {
				ph.waitPool(tc.pool, "1 Proxy after the refusal", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
					return p.Replicas() == 1
				})
				return
			}
			time.Sleep(time.Second)
			if got := ph.getPool(tc.pool); got.Replicas() != 0 {
				t.Errorf("replicas %d after a refusal for another namespace, want 0", got.Replicas())
			}
		})
	}
}

func TestProxyPoolAutoscalingWithoutALeaseStoreSaysSo(t *testing.T) {
	ph := startPool(t, poolSetup{noLeases: true})
	ph.newPool("blind", 2, func(p *v1alpha1.ProxyPool) {
		p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MaxReplicas: 5}
	})
	p, _ := ph.waitPool("blind", "AbleToScale False/NoLeaseStore", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionAbleToScale)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonNoLeaseStore && settled(2)(p, ps)
	})
	if p.Replicas() != 2 {
		t.Errorf("replicas %d, want the user's 2 left alone", p.Replicas())
	}
}

// A step up waits for the previous one to land, and the requests refused
// while it came up were refused for want of it: once it is Ready they do
// not count again. A crawler retrying while the first Proxy of an idle pool
// booted got the pool a second Proxy it did not need (until
// scaleDownDelaySeconds took it away again).
func TestProxyPoolAutoscalingIgnoresRefusalsFromBeforeTheLastStepLanded(t *testing.T) {
	ph := startPool(t, poolSetup{store: pool.StoreOptions{MaxLeasesPerMember: 100}, comingUp: 3 * time.Second})
	ph.newPool("cold", 0, func(p *v1alpha1.ProxyPool) {
		p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr32(0), MaxReplicas: 3, TargetLeasesPerProxy: 100, ScaleDownDelaySeconds: ptr32(3600)}
	})
	refused := func() {
		t.Helper()
		_, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Selector: map[string]string{"pool": "cold"}})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) {
			t.Fatalf("acquire = %v, want a 409", err)
		}
	}
	refused()
	ph.waitPool("cold", "1 Proxy coming up after a refusal", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 1 && len(ps) == 1
	})
	// The crawler retries while the Proxy boots.
	for range 3 {
		refused()
		time.Sleep(100 * time.Millisecond)
	}
	ph.waitPool("cold", "the Proxy Ready", settled(1))
	ph.acquireFor("cold", 1)
	deadline := time.Now().Add(2 * time.Second) // 20 autoscale intervals
	for time.Now().Before(deadline) {
		if p := ph.getPool("cold"); p.Replicas() != 1 {
			t.Fatalf("replicas %d after the Proxy landed and served, want 1: %s", p.Replicas(), poolCondition(p, v1alpha1.ConditionAbleToScale))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A refusal after it landed still steps up.
	ph.acquireFor("cold", 99)
	refused()
	ph.waitPool("cold", "2 Proxies after a refusal once the first landed", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return p.Replicas() == 2
	})
}

// A request pinned to a Proxy the pool is draining (scaled down, replaced,
// or drained by hand) is refused because that Proxy is on its way out; no
// new Proxy can serve it, so it is no demand for one. It stepped the pool
// up: a crawler whose sticky session was on a Proxy the autoscaler had
// just drained scaled the pool straight back up.
func TestProxyPoolAutoscalingIgnoresRequestsPinnedToADrainingProxy(t *testing.T) {
	ph := startPool(t, poolSetup{store: pool.StoreOptions{MaxLeasesPerMember: 100}})
	ph.newPool("sticky", 2, func(p *v1alpha1.ProxyPool) {
		p.Spec.DrainSeconds = ptr32(600)
		p.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr32(2), MaxReplicas: 4, TargetLeasesPerProxy: 100, ScaleDownDelaySeconds: ptr32(3600)}
	})
	_, ps := ph.waitPool("sticky", "2 Ready", settled(2))
	px := ps[0]
	ph.lease(&px) // held, so the drain lasts
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationDraining+`":"true"}}}`))
	if err := env.Client.Patch(ph.ctx(), &px, patch); err != nil {
		t.Fatal(err)
	}
	ph.waitPool("sticky", "a replacement Ready beside the draining one", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return len(ps) == 3 && readyCount(ps) == 2 && p.Status.DrainingReplicas == 1
	})
	// The crawler's sticky session asks for its Proxy again.
	poll.Until(t, wait, "a request pinned to the draining Proxy refused", func() error {
		_, err := ph.leases.Acquire(ph.ctx(), pool.AcquireRequest{Proxy: ph.ns + "/" + px.Name})
		var nm *pool.NoMatchError
		return poll.Check(errors.As(err, &nm), "acquire = %v, want a 409", err)
	})
	deadline := time.Now().Add(2 * time.Second) // 20 autoscale intervals
	for time.Now().Before(deadline) {
		if p := ph.getPool("sticky"); p.Replicas() != 2 {
			t.Fatalf("replicas %d after a request pinned to a draining Proxy, want 2: %s", p.Replicas(), poolCondition(p, v1alpha1.ConditionAbleToScale))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
