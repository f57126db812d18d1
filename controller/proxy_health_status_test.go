package controller

import (
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// askedHealth is a fakeHealth that counts Snapshot calls, so a test knows a
// reconcile reached applyHealth.
type askedHealth struct {
	fakeHealth
	calls atomic.Int64
}

func (a *askedHealth) Snapshot(key types.NamespacedName) (HealthSnapshot, bool) {
	a.calls.Add(1)
	return a.fakeHealth.Snapshot(key)
}

// TestHealthInStatusOutlivesAnEngineNotTrackingYetButNotAnAddressChange
// checks both sides of applyHealth's "leave status alone": a verdict in
// status survives reconciles while the engine does not track the Proxy (a
// restarted controller before the engine's first round must not flap a
// healthy fleet), and it is dropped when the address it belonged to changes.
func TestHealthInStatusOutlivesAnEngineNotTrackingYetButNotAnAddressChange(t *testing.T) {
	t.Parallel()
	events := make(chan event.GenericEvent, 4)
	health := &askedHealth{} // tracks nothing
	h := start(t, setup{healthEvents: events, health: health})
	h.create(gen.Proxy("ext", gen.SetProxyNamespace(h.ns), gen.SetProxyEndpoint("127.0.0.21", 3128)))
	h.waitProxy("ext", "served", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.21" && p.Status.Phase == v1alpha1.PhaseProvisioning
	})

	// The verdict a previous controller run left in status.
	poll.Until(h.t, wait, "a Healthy verdict in status", func() error {
		p, err := h.get("ext")
		if err != nil {
			return err
		}
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy,
			Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "200 before the restart"})
		p.Status.LatencyMillis = 42
		p.Status.Phase = v1alpha1.PhaseReady
		if err := env.Client.Status().Update(h.ctx(), p); err != nil {
			return err
		}
		return nil
	})
	// Two reconciles that reach applyHealth: one key is never reconciled
	// twice at once, so the first one's status write has landed when the
	// second asks.
	for i := range 2 {
		before := health.calls.Load()
		events <- event.GenericEvent{Object: h.mustGet("ext")}
		poll.Until(h.t, wait, "a reconcile asking the health source", func() error {
			return poll.Check(health.calls.Load() > before, "reconcile %d not yet", i+1)
		})
	}
	p := h.mustGet("ext")
	if !p.IsHealthy() || p.Status.LatencyMillis != 42 || p.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("status lost the verdict while the engine tracked nothing: %s, latency %d", describe(p), p.Status.LatencyMillis)
	}

	h.edit("ext", func(p *v1alpha1.Proxy) { p.Spec.Endpoint.Host = "127.0.0.22" })
	p = h.waitProxy("ext", "the new address without the old verdict", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.22" && p.Condition(v1alpha1.ConditionHealthy) == nil
	})
	if p.Status.LatencyMillis != 0 || p.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Errorf("after the address change: latency %d, phase %s; want 0 and Provisioning", p.Status.LatencyMillis, p.Status.Phase)
	}
}

// TestAManagedInstanceAtANewAddressLosesTheOldVerdict checks that a verdict
// belongs to an address: when the provider reports the instance at another
// IP (a VM restarted by hand), the drift poll drops the Healthy condition
// even though the engine has not caught up yet.
func TestAManagedInstanceAtANewAddressLosesTheOldVerdict(t *testing.T) {
	t.Parallel()
	health := &askedHealth{} // tracks nothing
	h := start(t, setup{health: health})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	poll.Until(h.t, wait, "a Healthy verdict in status", func() error {
		p, err := h.get("px")
		if err != nil {
			return err
		}
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy,
			Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "200 at the old address"})
		p.Status.LatencyMillis = 42
		if err := env.Client.Status().Update(h.ctx(), p); err != nil {
			return err
		}
		return nil
	})
	inst, err := h.fake.Get(h.ctx(), p.Status.ProviderID)
	if err != nil {
		t.Fatal(err)
	}
	inst.IP = "127.0.10.200"
	h.fake.Put(inst)
	p = h.waitProxy("px", "the new address without the old verdict", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.10.200" && p.Condition(v1alpha1.ConditionHealthy) == nil
	})
	if p.Status.LatencyMillis != 0 || p.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Errorf("after the address change: latency %d, phase %s; want 0 and Provisioning", p.Status.LatencyMillis, p.Status.Phase)
	}
}

// TestProbeVerdictReachesStatusWhileTheProviderCannotBeAsked pins that the
// health engine's verdict is applied on every pass of a Managed Proxy, not
// only after a successful look at its instance: a hypervisor that refuses
// SSH, a cloud API that rate-limits or a spec latched Failed must not keep a
// Proxy the probe finds down Healthy (and leased). A rate-limited look at a
// running instance also keeps it Provisioned, as a transient one does.
func TestProbeVerdictReachesStatusWhileTheProviderCannotBeAsked(t *testing.T) {
	for _, tc := range []struct {
		name             string
		fail             func(f *providertest.Provider)
		stillProvisioned bool
	}{
		{"the provider's API refuses (transient)", func(f *providertest.Provider) {
			f.FailAlways(providers.OpGet, providertest.ErrClass(providers.ErrTransient, "ssh: connect: connection refused"))
		}, true},
		{"the provider's API rate-limits (quota)", func(f *providertest.Provider) {
			f.FailAlways(providers.OpGet, providertest.ErrClass(providers.ErrQuotaExceeded, "429 rateLimitExceeded"))
		}, true},
		{"the spec is latched Failed (permanent)", func(f *providertest.Provider) {
			f.FailNext(providers.OpGet, 1, providertest.ErrClass(providers.ErrPermanent, "403 forbidden"))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			events := make(chan event.GenericEvent, 4)
			health := &askedHealth{}
			h := start(t, setup{healthEvents: events, health: health})
			key := types.NamespacedName{Namespace: h.ns, Name: "px"}
			health.set(key, HealthSnapshot{Known: true, Healthy: true, Message: "200"})
			h.create(h.managed("px"))
			h.waitProxy("px", "Ready", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseReady })

			tc.fail(h.fake)
			health.set(key, HealthSnapshot{Known: true, Healthy: false, Message: "dial tcp: connection refused"})
			events <- event.GenericEvent{Object: h.mustGet("px")}
			p := h.waitProxy("px", "the probe's verdict in status", func(p *v1alpha1.Proxy) bool {
				c := p.Condition(v1alpha1.ConditionHealthy)
				return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonProbeFailed
			})
			if got := meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned); got != tc.stillProvisioned {
				t.Errorf("Provisioned %v, want %v: %s", got, tc.stillProvisioned, describe(p))
			}
		})
	}
}
