package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// deleteProxy asks the API server to delete a Proxy.
func (h *harness) deleteProxy(name string) {
	h.t.Helper()
	if err := env.Client.Delete(h.ctx(), h.mustGet(name)); err != nil {
		h.t.Fatalf("delete Proxy %s: %v", name, err)
	}
}

func TestDeletionDeletesTheInstanceThenReleases(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	h.deleteProxy("px")
	h.waitGone("px")
	if h.fake.Exists(p.Status.ProviderID) {
		t.Errorf("instance %s still exists after its Proxy is gone", p.Status.ProviderID)
	}
	if n := h.fake.Count(providers.OpDelete); n < 1 {
		t.Errorf("Delete never called")
	}
}

func TestDeletionPollsWhileDeletingAndShowsDeleting(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.SetDeleteGets(1 << 30) // the instance never finishes going away
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	h.deleteProxy("px")
	h.waitProxy("px", "Deleting", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseDeleting && reason(p) == v1alpha1.ReasonDeleting
	})
	gets := h.fake.Count(providers.OpGet)
	poll.Until(h.t, wait, "deletion polls", func() error { return poll.Check(h.fake.Count(providers.OpGet) >= gets+3, "%s", h.fake.String()) })
	if got := h.mustGet("px"); !controllerutil.ContainsFinalizer(got, v1alpha1.Finalizer) {
		t.Fatalf("finalizer released while the instance still exists")
	}
	// Once the backend finishes, the object goes.
	h.fake.Vanish(p.Status.ProviderID)
	h.waitGone("px")
}

func TestDeletionWithPermanentlyFailingGetStillCallsDelete(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	h.fake.FailAlways(providers.OpGet, providertest.ErrClass(providers.ErrPermanent, "host not in config"))
	deletes := h.fake.Count(providers.OpDelete)
	h.deleteProxy("px")
	h.waitGone("px")
	if n := h.fake.Count(providers.OpDelete); n != deletes+1 {
		t.Errorf("Delete called %d times during deletion, want 1", n-deletes)
	}
	if h.fake.Exists(p.Status.ProviderID) {
		// Delete was accepted: the instance is going away in the backend.
		state, _ := h.fake.State(p.Status.ProviderID)
		if state != providers.StateTerminated {
			t.Errorf("instance state %s after Delete", state)
		}
	}
}

func TestDeletionNeverLatchesAPermanentDeleteFailure(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	h.waitRunning("px")
	h.fake.FailAlways(providers.OpDelete, providertest.ErrClass(providers.ErrPermanent, "permission denied"))
	h.deleteProxy("px")
	p := h.waitProxy("px", "Delete retried", func(p *v1alpha1.Proxy) bool {
		return h.fake.Count(providers.OpDelete) >= 3 && strings.Contains(message(p), "permission denied")
	})
	if p.Status.Phase != v1alpha1.PhaseDeleting {
		t.Errorf("phase %s, want Deleting (never Failed during deletion)", p.Status.Phase)
	}
	if !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		t.Fatalf("finalizer dropped although the instance could not be deleted")
	}
	if !strings.Contains(message(p), v1alpha1.AnnotationSkipCleanup) {
		t.Errorf("condition %q does not tell the user about %s", message(p), v1alpha1.AnnotationSkipCleanup)
	}
	h.fake.ClearFailures()
	h.waitGone("px")
}

func TestSkipCleanupReleasesWithoutProviderCalls(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	h.waitRunning("px")
	h.edit("px", func(p *v1alpha1.Proxy) {
		p.Annotations[v1alpha1.AnnotationSkipCleanup] = v1alpha1.ValueTrue
	})
	h.waitProxy("px", "annotation seen", func(p *v1alpha1.Proxy) bool { return p.SkipCleanup() })
	calls := len(h.fake.Ops())
	h.deleteProxy("px")
	h.waitGone("px")
	for _, op := range h.fake.Ops()[calls:] {
		if op != providers.OpGet {
			t.Errorf("provider %s during a skip-cleanup deletion", op)
		}
	}
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("Delete called %d times with skip-cleanup, want 0", n)
	}
}

func TestDeletionWithTheProviderGoneWaitsForSkipCleanup(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	px := h.managed("px")
	px.Spec.Provider = "removed"
	// An instance made before its provider left the config: the finalizer
	// is on (it goes on before any Create) and the status records the
	// instance.
	px.Finalizers = []string{v1alpha1.Finalizer}
	h.create(px)
	h.waitProxy("px", "Failed", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseFailed && controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer)
	})
	p := h.mustGet("px")
	p.Status.ProviderID = "removed/proxy-abc"
	if err := env.Client.Status().Update(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.deleteProxy("px")
	p = h.waitProxy("px", "stuck deleting with advice", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseDeleting && strings.Contains(message(p), v1alpha1.AnnotationSkipCleanup)
	})
	if !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		t.Fatalf("finalizer dropped without cleanup or skip-cleanup")
	}
	h.edit("px", func(p *v1alpha1.Proxy) {
		p.Annotations = map[string]string{v1alpha1.AnnotationSkipCleanup: v1alpha1.ValueTrue}
	})
	h.waitGone("px")
	if ops := h.fake.Ops(); len(ops) != 0 {
		t.Errorf("provider calls: %v", ops)
	}
}

func TestDeletionWithoutARecordedInstanceDeletesByTheDerivedIDOnceAndReleases(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrQuotaExceeded, "no capacity"))
	h.create(h.managed("px"))
	p := h.waitProxy("px", "waiting for quota", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonQuotaExceeded })
	h.deleteProxy("px")
	h.waitGone("px")
	want := []string{providers.OpDelete + "(" + providertest.ProviderID(providers.NameFromUID(string(p.UID))) + ")", providers.OpGet + "(" + providertest.ProviderID(providers.NameFromUID(string(p.UID))) + ")"}
	var got []string
	for _, c := range h.fake.Calls() {
		if c.Op != providers.OpCreate {
			got = append(got, c.Op+"("+c.Arg+")")
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("calls during the deletion = %v, want %v: one Delete by the name a Create would have used, one Get to NotFound", got, want)
	}
}

func TestDeletionOfAnInstanceAlreadyGoneReleases(t *testing.T) {
	t.Parallel()
	// No drift polls: the deletion is the first pass to see the instance gone.
	iv := fastIntervals()
	iv.DriftPoll = time.Hour
	h := start(t, setup{intervals: &iv})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	h.fake.Vanish(p.Status.ProviderID)
	gets := h.fake.Count(providers.OpGet)
	h.deleteProxy("px")
	h.waitGone("px")
	if h.fake.Count(providers.OpGet) == gets {
		t.Errorf("deletion did not ask the provider about the instance")
	}
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("Delete called %d times for an instance the provider reports NotFound", n)
	}
}

func TestExternalProxySetsAddressAndNeverCallsAProvider(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(gen.Proxy("ext", gen.SetProxyNamespace(h.ns), gen.SetProxyEndpoint("127.0.0.7", 3129)))
	p := h.waitRunning("ext")
	if p.Status.IP != "127.0.0.7" || reason(p) != v1alpha1.ReasonExternalEndpoint {
		t.Errorf("status: %s", describe(p))
	}
	if controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		t.Errorf("an External Proxy got the finalizer")
	}
	h.edit("ext", func(p *v1alpha1.Proxy) { p.Spec.Endpoint.Host = "127.0.0.8" })
	h.waitProxy("ext", "new endpoint", func(p *v1alpha1.Proxy) bool { return p.Status.IP == "127.0.0.8" })
	h.deleteProxy("ext")
	h.waitGone("ext")
	if ops := h.fake.Ops(); len(ops) != 0 {
		t.Errorf("provider calls for an External Proxy: %v", ops)
	}
}

func TestDeletionRetriesATransientGetThenReleases(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	h.fake.FailNext(providers.OpGet, 3, providertest.ErrClass(providers.ErrTransient, "timeout"))
	h.deleteProxy("px")
	h.waitGone("px")
	if h.fake.Exists(p.Status.ProviderID) {
		t.Errorf("instance %s left behind", p.Status.ProviderID)
	}
	if errs := h.logs.errorLines(); !strings.Contains(strings.Join(errs, "\n"), "timeout") {
		t.Errorf("a transient Get during deletion should be returned for backoff; error lines: %q", errs)
	}
}

func TestDeletionWaitsOutAQuotaErrorWithoutErrorLogs(t *testing.T) {
	t.Parallel()
	iv := fastIntervals()
	iv.QuotaRetry = time.Hour
	h := start(t, setup{intervals: &iv})
	h.create(h.managed("px"))
	h.waitRunning("px")
	h.fake.FailAlways(providers.OpDelete, providertest.ErrClass(providers.ErrQuotaExceeded, "delete rate quota exhausted"))
	h.deleteProxy("px")
	p := h.waitProxy("px", "QuotaExceeded while deleting", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonQuotaExceeded && p.Status.Phase == v1alpha1.PhaseDeleting
	})
	if !strings.Contains(message(p), "delete rate quota exhausted") {
		t.Errorf("condition message %q does not say what the provider said", message(p))
	}
	time.Sleep(time.Second)
	if n := h.fake.Count(providers.OpDelete); n != 1 {
		t.Errorf("Delete called %d times within a second, want 1: the retry waits QuotaRetry", n)
	}
	if errs := h.logs.errorLines(); len(errs) != 0 {
		t.Errorf("a quota wait during deletion logged errors: %q", errs)
	}
	if p := h.mustGet("px"); !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		t.Fatalf("finalizer dropped while the instance could not be deleted")
	}
}
