package controller

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

func TestFinalizerIsAddedBeforeTheInstanceIsCreated(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	finalizerAtCreate := make(chan bool, 10)
	h.fake.OnCreate(func(req providers.CreateRequest) {
		p, err := h.get(req.OwnerName)
		finalizerAtCreate <- err == nil && controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer)
	})
	h.create(h.managed("px"))
	h.waitRunning("px")
	if !<-finalizerAtCreate {
		t.Fatalf("the Proxy had no %s finalizer when the provider was asked to create its instance", v1alpha1.Finalizer)
	}
}

func TestCreateRunningSetsAddressHashAndCondition(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	px := h.managed("px")
	px.Spec.Port = 8080
	px.Spec.CloudInit = &v1alpha1.CloudInit{Inline: "#cloud-config\npackages: [squid]\n"}
	h.create(px)
	p := h.waitRunning("px")

	reqs := h.fake.Creates()
	if len(reqs) != 1 {
		t.Fatalf("Create called %d times, want 1: %s", len(reqs), h.fake)
	}
	req := reqs[0]
	wantName := providers.NameFromUID(string(p.UID))
	if req.Name != wantName || req.OwnerUID != string(p.UID) || req.OwnerName != "px" || req.OwnerNamespace != h.ns {
		t.Errorf("CreateRequest identity = %q/%q/%q/%q, want %q, the UID, px, %s", req.Name, req.OwnerUID, req.OwnerName, req.OwnerNamespace, wantName, h.ns)
	}
	if req.Installation != testInstallation {
		t.Errorf("CreateRequest installation = %q, want the reconciler's %q (the orphan GC's proof of whose)", req.Installation, testInstallation)
	}
	if req.Port != 8080 || req.Placement != (providers.Placement{Zone: "zone-a", MachineType: "small", Image: "squid"}) {
		t.Errorf("CreateRequest port/placement = %d %+v", req.Port, req.Placement)
	}
	if string(req.CloudInit) != px.Spec.CloudInit.Inline {
		t.Errorf("CreateRequest cloud-init = %q, want the inline block", req.CloudInit)
	}
	if p.Status.ProviderID != providertest.ProviderID(wantName) {
		t.Errorf("status.providerID = %q, want %q", p.Status.ProviderID, providertest.ProviderID(wantName))
	}
	if !strings.HasPrefix(p.Status.IP, "127.0.10.") {
		t.Errorf("status.ip = %q, want the instance's address", p.Status.IP)
	}
	if reason(p) != v1alpha1.ReasonCreated {
		t.Errorf("Provisioned reason = %q, want %s", reason(p), v1alpha1.ReasonCreated)
	}
	if got, want := p.Annotations[v1alpha1.AnnotationSpecHash], specHash(p, []byte(px.Spec.CloudInit.Inline), ""); got != want {
		t.Errorf("spec-hash annotation = %q, want %q", got, want)
	}
	if p.Status.ObservedGeneration != p.Generation {
		t.Errorf("observedGeneration = %d, want %d", p.Status.ObservedGeneration, p.Generation)
	}
	// No health engine in this test: provisioned but no verdict yet.
	if p.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Errorf("phase = %s, want %s until a health verdict arrives", p.Status.Phase, v1alpha1.PhaseProvisioning)
	}
}

func TestProvisioningInstanceIsPolledUntilItRuns(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.SetStartState(providers.StateProvisioning)
	h.create(h.managed("px"))
	p := h.waitProxy("px", "Provisioning with a providerID", func(p *v1alpha1.Proxy) bool {
		return p.Status.ProviderID != "" && reason(p) == v1alpha1.ReasonProvisioning && p.Status.Phase == v1alpha1.PhaseProvisioning
	})
	gets := h.fake.Count(providers.OpGet)
	poll.Until(h.t, wait, "more polls while provisioning", func() error {
		n := h.fake.Count(providers.OpGet)
		return poll.Check(n >= gets+3, "%s", h.fake.String())
	})
	if p.Status.IP != "" {
		t.Fatalf("status.ip = %q while provisioning, want empty", p.Status.IP)
	}
	h.fake.SetState(p.Status.ProviderID, providers.StateRunning)
	h.waitRunning("px")
	if n := h.fake.Count(providers.OpCreate); n != 1 {
		t.Errorf("Create called %d times, want 1", n)
	}
}

func TestPermanentErrorLatchesUntilSpecEdit(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrPermanent, "machine type does not exist"))
	h.create(h.managed("px"))
	p := h.waitProxy("px", "Failed", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseFailed })
	if reason(p) != v1alpha1.ReasonPermanentError || !strings.Contains(message(p), "machine type does not exist") {
		t.Fatalf("Provisioned = %s %q, want PermanentError with the provider's message", reason(p), message(p))
	}
	// Latched: many poll intervals pass without another provider call.
	time.Sleep(1500 * time.Millisecond)
	if n := h.fake.Count(providers.OpCreate); n != 1 {
		t.Fatalf("Create called %d times while latched, want 1", n)
	}
	if errs := h.logs.errorLines(); len(errs) != 0 {
		t.Errorf("a permanent failure is a condition, not an error log; got %q", errs)
	}

	// A spec edit is the way out.
	h.fake.ClearFailures()
	h.edit("px", func(p *v1alpha1.Proxy) { p.Spec.Placement.MachineType = "medium" })
	p = h.waitRunning("px")
	if n := h.fake.Count(providers.OpCreate); n != 2 {
		t.Errorf("Create called %d times, want 2 (one failed, one after the edit)", n)
	}
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Errorf("phase still Failed after recovery: %s", describe(p))
	}
}

func TestQuotaExceededWaitsWithoutErrorAndNeverFails(t *testing.T) {
	t.Parallel()
	iv := fastIntervals()
	iv.QuotaRetry = time.Hour
	h := start(t, setup{intervals: &iv})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrQuotaExceeded, "CPUS quota exhausted in zone-a"))
	h.create(h.managed("px"))
	p := h.waitProxy("px", "QuotaExceeded", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonQuotaExceeded })
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Fatalf("quota exhaustion made the Proxy Failed: %s", describe(p))
	}
	if !strings.Contains(message(p), "CPUS quota exhausted") {
		t.Errorf("condition message %q does not say what the provider said", message(p))
	}
	time.Sleep(time.Second)
	if n := h.fake.Count(providers.OpCreate); n != 1 {
		t.Errorf("Create called %d times within a second, want 1: the retry waits QuotaRetry, not the error backoff", n)
	}
	if errs := h.logs.errorLines(); len(errs) != 0 {
		t.Errorf("quota exhaustion logged errors: %q", errs)
	}
	// The reconcile itself returns no error and asks for QuotaRetry.
	res, err := h.r.Reconcile(context.Background(), reqFor(p))
	if err != nil || res.RequeueAfter != time.Hour {
		t.Errorf("Reconcile = %+v, %v; want RequeueAfter %s and a nil error", res, err, time.Hour)
	}
	if p := h.mustGet("px"); p.Status.Phase == v1alpha1.PhaseFailed || reason(p) != v1alpha1.ReasonQuotaExceeded {
		t.Errorf("after another pass: %s", describe(p))
	}
}

func TestTransientErrorIsRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.FailNext(providers.OpCreate, 2, providertest.ErrClass(providers.ErrTransient, "503 backend unavailable"))
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	if n := h.fake.Count(providers.OpCreate); n != 3 {
		t.Errorf("Create called %d times, want 3 (two transient failures, then success)", n)
	}
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Errorf("transient errors made the Proxy Failed")
	}
	errs := h.logs.errorLines()
	if len(errs) < 2 || !strings.Contains(strings.Join(errs, "\n"), "503 backend unavailable") {
		t.Errorf("transient errors should be returned to the workqueue (and logged); error lines: %q", errs)
	}
}

func TestMissingProviderFailsWithMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		noProviders bool
		provider    string
		wantMsg     string
	}{
		{name: "provider not in the config", provider: "gcp-eu", wantMsg: `provider "gcp-eu" is not configured`},
		{name: "no providers config at all", noProviders: true, provider: fakeName, wantMsg: "no providers config was given"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, setup{noProviders: tc.noProviders})
			px := h.managed("px")
			px.Spec.Provider = tc.provider
			h.create(px)
			p := h.waitProxy("px", "Failed", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseFailed })
			if reason(p) != v1alpha1.ReasonProviderNotConfigured || !strings.Contains(message(p), tc.wantMsg) {
				t.Errorf("Provisioned = %s %q, want ProviderNotConfigured saying %q", reason(p), message(p), tc.wantMsg)
			}
			if n := len(h.fake.Ops()); n != 0 {
				t.Errorf("the test double saw %d calls, want none", n)
			}
		})
	}
}

func TestCloudInitFromLabelledSecret(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(cloudInitSecret(h.ns, "ci", true, "#cloud-config\nruncmd: [echo one]\n"))
	px := h.managed("px")
	px.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: &v1alpha1.SecretKeyRef{Name: "ci"}}
	h.create(px)
	h.waitRunning("px")
	reqs := h.fake.Creates()
	if len(reqs) != 1 || string(reqs[0].CloudInit) != "#cloud-config\nruncmd: [echo one]\n" {
		t.Fatalf("Create requests %+v, want one carrying the Secret's user-data", reqs)
	}
}

func TestUnlabelledSecretIsCloudInitErrorUntilLabelled(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(cloudInitSecret(h.ns, "ci", false, "#cloud-config\n"))
	px := h.managed("px")
	px.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: &v1alpha1.SecretKeyRef{Name: "ci"}}
	h.create(px)
	p := h.waitProxy("px", "CloudInitError", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonCloudInitError })
	if !strings.Contains(message(p), v1alpha1.LabelCloudInit) {
		t.Errorf("message %q should name the label the Secret needs", message(p))
	}
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Errorf("a missing Secret is retried, not Failed")
	}
	if n := h.fake.Count(providers.OpCreate); n != 0 {
		t.Fatalf("Create called %d times without cloud-init, want 0", n)
	}
	// Labelling it makes it visible; the Secret watch brings the Proxy back.
	var s corev1.Secret
	if err := env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: "ci"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Labels = map[string]string{v1alpha1.LabelCloudInit: v1alpha1.ValueTrue}
	if err := env.Client.Update(h.ctx(), &s); err != nil {
		t.Fatal(err)
	}
	h.waitRunning("px")
}

func TestSpecEditReplacesTheInstanceUnderTheSameName(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	before := h.waitRunning("px")
	oldHash := before.Annotations[v1alpha1.AnnotationSpecHash]

	h.edit("px", func(p *v1alpha1.Proxy) { p.Spec.Placement.Zone = "zone-b" })
	after := h.waitProxy("px", "running in zone-b", func(p *v1alpha1.Proxy) bool {
		reqs := h.fake.Creates()
		return len(reqs) == 2 && reqs[1].Placement.Zone == "zone-b" &&
			p.Status.IP != "" && reason(p) == v1alpha1.ReasonCreated
	})
	assertReplacedInPlace(t, h, before, after)
	if after.Annotations[v1alpha1.AnnotationSpecHash] == oldHash {
		t.Errorf("spec-hash annotation unchanged after the edit")
	}
}

func TestEditsThatDoNotShapeTheInstanceKeepIt(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	h.waitRunning("px")
	h.edit("px", func(p *v1alpha1.Proxy) {
		p.Spec.Attributes = map[string]string{"region": "eu"}
		p.Spec.HealthCheck.IntervalSeconds = 30
	})
	p := h.waitProxy("px", "observed the edit", func(p *v1alpha1.Proxy) bool { return p.Status.ObservedGeneration == p.Generation })
	time.Sleep(500 * time.Millisecond)
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("attribute/health-check edit deleted the instance (%d Deletes): %s", n, describe(p))
	}
}

func TestSecretRotationReplacesTheInstance(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(cloudInitSecret(h.ns, "ci", true, "#cloud-config\nruncmd: [echo one]\n"))
	px := h.managed("px")
	px.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: &v1alpha1.SecretKeyRef{Name: "ci"}}
	h.create(px)
	// A second Proxy not referencing the Secret must be left alone.
	h.create(h.managed("other"))
	before := h.waitRunning("px")
	h.waitRunning("other")

	var s corev1.Secret
	if err := env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: "ci"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data[v1alpha1.DefaultCloudInitSecretKey] = []byte("#cloud-config\nruncmd: [echo two]\n")
	if err := env.Client.Update(h.ctx(), &s); err != nil {
		t.Fatal(err)
	}
	after := h.waitProxy("px", "running with the rotated cloud-init", func(p *v1alpha1.Proxy) bool {
		reqs := h.fake.Creates()
		last := reqs[len(reqs)-1]
		return last.OwnerName == "px" && string(last.CloudInit) == "#cloud-config\nruncmd: [echo two]\n" &&
			p.Status.IP != "" && reason(p) == v1alpha1.ReasonCreated
	})
	assertReplacedInPlace(t, h, before, after)
	if got := after.Generation; got != before.Generation {
		t.Errorf("generation %d → %d: rotation must not need a spec edit", before.Generation, got)
	}
	others := 0
	for _, r := range h.fake.Creates() {
		if r.OwnerName == "other" {
			others++
		}
	}
	if others != 1 {
		t.Errorf("the Proxy not referencing the Secret was created %d times, want 1", others)
	}
}

// assertReplacedInPlace checks the replacement sequence: the old instance was
// deleted, polled until NotFound, and only then created again under the same
// name and providerID.
func assertReplacedInPlace(t *testing.T, h *harness, before, after *v1alpha1.Proxy) {
	t.Helper()
	if after.Status.ProviderID != before.Status.ProviderID {
		t.Errorf("providerID %q → %q, want the same deterministic name", before.Status.ProviderID, after.Status.ProviderID)
	}
	calls := h.fake.Calls()
	var seq []string
	for _, c := range calls {
		if c.Arg == before.Status.ProviderID || c.Arg == providers.NameFromUID(string(before.UID)) {
			seq = append(seq, c.Op)
		}
	}
	del := slices.Index(seq, providers.OpDelete)
	if del < 0 {
		t.Fatalf("no Delete of the old instance: %v", seq)
	}
	creates := 0
	for i, op := range seq {
		if op == providers.OpCreate {
			creates++
			if creates == 2 && i < del {
				t.Errorf("recreated before deleting: %v", seq)
			}
		}
	}
	// Between the Delete and the second Create there must be Gets, the last
	// of which saw NotFound (the fake keeps a deleted instance for two Gets).
	second := del + slices.Index(seq[del:], providers.OpCreate)
	if second <= del {
		t.Fatalf("no Create after the Delete: %v", seq)
	}
	gets := 0
	for _, op := range seq[del:second] {
		if op == providers.OpGet {
			gets++
		}
	}
	if gets < 3 {
		t.Errorf("Create came after %d Gets; the reconciler must poll until NotFound (3 here): %v", gets, seq)
	}
}

func TestAdoptionSetsTheHashWithoutCreating(t *testing.T) {
	t.Parallel()
	var uid types.UID
	h := start(t, setup{beforeStart: func(h *harness) {
		px := h.managed("px")
		px.Finalizers = []string{v1alpha1.Finalizer}
		h.create(px)
		uid = px.UID
		name := providers.NameFromUID(string(px.UID))
		h.fake.Put(providers.Instance{ProviderID: providertest.ProviderID(name), Name: name, State: providers.StateRunning, IP: "127.0.10.200", OwnerUID: string(px.UID)})
		px.Status.ProviderID = providertest.ProviderID(name)
		if err := env.Client.Status().Update(h.ctx(), px); err != nil {
			h.t.Fatalf("seeding status: %v", err)
		}
	}})
	p := h.waitProxy("px", "adopted", func(p *v1alpha1.Proxy) bool {
		return p.Annotations[v1alpha1.AnnotationSpecHash] != "" && p.Status.IP == "127.0.10.200"
	})
	if n := h.fake.Count(providers.OpCreate); n != 0 {
		t.Errorf("Create called %d times for an adopted instance, want 0", n)
	}
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("Delete called %d times for an adopted instance, want 0", n)
	}
	if p.UID != uid || p.Annotations[v1alpha1.AnnotationSpecHash] != specHash(p, nil, "") {
		t.Errorf("annotation %q, want the hash of the current spec", p.Annotations[v1alpha1.AnnotationSpecHash])
	}
}

func TestVanishedInstanceIsRecreated(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	before := h.waitRunning("px")
	h.fake.Vanish(before.Status.ProviderID)
	h.waitProxy("px", "recreated", func(p *v1alpha1.Proxy) bool {
		return h.fake.Count(providers.OpCreate) == 2 && p.Status.IP != "" && p.Status.IP != before.Status.IP
	})
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("Delete called %d times for a vanished instance, want 0", n)
	}
}

// TestAnInstanceThatVanishesBeforeItRanIsCreatedAgainAfterAWait pins what a
// create the provider accepted and then dropped (a GCP zone out of
// capacity) does: the Proxy says so (CreateFailed, phase Pending) and
// creates again after a wait, where it used to create again at once, every
// few seconds, for as long as the zone stayed full.
func TestAnInstanceThatVanishesBeforeItRanIsCreatedAgainAfterAWait(t *testing.T) {
	t.Parallel()
	iv := fastIntervals()
	iv.RequeueNow = 2 * time.Second // the first wait
	h := start(t, setup{intervals: &iv})
	h.fake.SetStartState(providers.StateProvisioning)
	h.create(h.managed("px"))
	p := h.waitProxy("px", "Provisioning", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	h.fake.Vanish(p.Status.ProviderID)
	p = h.waitProxy("px", "CreateFailed", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonCreateFailed })
	if p.Status.Phase != v1alpha1.PhasePending || p.Status.ProviderID != "" ||
		!strings.Contains(p.Condition(v1alpha1.ConditionProvisioned).Message, "vanished before it ran") {
		t.Errorf("after the vanish: %s", describe(p))
	}
	if n := h.fake.Count(providers.OpCreate); n != 1 {
		t.Errorf("Create called %d times right after the vanish, want 1 (the next after a wait)", n)
	}
	h.waitProxy("px", "created again", func(p *v1alpha1.Proxy) bool {
		return h.fake.Count(providers.OpCreate) == 2 && p.Status.ProviderID != ""
	})
}

func TestCreateRetryAfterGrowsWithHowLongTheProxyHasBeenFailing(t *testing.T) {
	r := &ProxyReconciler{Intervals: Intervals{RequeueNow: time.Second, QuotaRetry: 5 * time.Minute}}
	for _, tc := range []struct {
		name    string
		failing time.Duration
		want    time.Duration
	}{
		{"just failed: RequeueNow", 0, time.Second},
		{"failing for 30s: 30s", 30 * time.Second, 30 * time.Second},
		{"failing for an hour: QuotaRetry", time.Hour, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := gen.Proxy("px")
			p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonProvisioning, LastTransitionTime: metav1.NewTime(time.Now().Add(-tc.failing))}}
			if got := r.createRetryAfter(p); got != tc.want {
				t.Fatalf("createRetryAfter = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestStoppedInstanceIsDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	for _, state := range []providers.State{providers.StateStopped, providers.StateTerminated} {
		t.Run(string(state), func(t *testing.T) {
			t.Parallel()
			h := start(t, setup{})
			h.create(h.managed("px"))
			before := h.waitRunning("px")
			h.fake.SetState(before.Status.ProviderID, state)
			after := h.waitProxy("px", "replaced", func(p *v1alpha1.Proxy) bool {
				return h.fake.Count(providers.OpCreate) == 2 && p.Status.IP != "" && reason(p) == v1alpha1.ReasonCreated
			})
			assertReplacedInPlace(t, h, before, after)
			if after.Status.IP == before.Status.IP {
				t.Errorf("status.ip kept the stopped instance's address %s", after.Status.IP)
			}
		})
	}
}

func TestHealthEventsReachTheReconciler(t *testing.T) {
	t.Parallel()
	events := make(chan event.GenericEvent, 4)
	health := &fakeHealth{}
	// No drift polls: only the channel can bring the verdicts in.
	iv := fastIntervals()
	iv.DriftPoll = time.Hour
	h := start(t, setup{healthEvents: events, health: health, intervals: &iv})
	h.create(h.managed("px"))
	p := h.waitRunning("px")
	key := types.NamespacedName{Namespace: h.ns, Name: "px"}

	health.set(key, HealthSnapshot{Known: true, Healthy: true, Message: "200 through the proxy", Latency: 42 * time.Millisecond, CheckedAt: time.Now()})
	events <- event.GenericEvent{Object: p}
	p = h.waitProxy("px", "Ready", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseReady })
	if p.Status.LatencyMillis != 42 || p.Status.LastHealthCheckTime == nil {
		t.Errorf("latency %d, lastHealthCheckTime %v; want 42 and a time", p.Status.LatencyMillis, p.Status.LastHealthCheckTime)
	}

	health.set(key, HealthSnapshot{Known: true, Healthy: false, Message: "connection refused", CheckedAt: time.Now()})
	events <- event.GenericEvent{Object: p}
	p = h.waitProxy("px", "Unhealthy", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseUnhealthy })
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy); c == nil || c.Message != "connection refused" {
		t.Errorf("Healthy condition %+v, want the engine's message", c)
	}
}

func TestSteadyProxyCausesNoStatusWrites(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	h.waitRunning("px")
	// Let the last write of the provisioning sequence land.
	poll.Until(h.t, wait, "a few steady drift polls", func() error {
		return poll.Check(h.fake.Count(providers.OpGet) >= 3, "%s", h.fake.String())
	})
	writes := h.client.statusWrites.Load()
	rv := h.mustGet("px").ResourceVersion
	gets := h.fake.Count(providers.OpGet)
	poll.Until(h.t, wait, "six more reconciles of the steady Proxy", func() error {
		return poll.Check(h.fake.Count(providers.OpGet) >= gets+6, "%s", h.fake.String())
	})
	if got := h.client.statusWrites.Load() - writes; got != 0 {
		t.Errorf("%d status writes during steady reconciles, want 0", got)
	}
	if got := h.mustGet("px").ResourceVersion; got != rv {
		t.Errorf("resourceVersion moved %s → %s with nothing changed", rv, got)
	}
}

// cloudInitSecret returns a Secret holding user-data, with or without the
// label that makes it visible to the controller.
func cloudInitSecret(ns, name string, labelled bool, data string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Data:       map[string][]byte{v1alpha1.DefaultCloudInitSecretKey: []byte(data)},
	}
	if labelled {
		s.Labels = map[string]string{v1alpha1.LabelCloudInit: v1alpha1.ValueTrue}
	}
	return s
}

func TestReconcileOfAMissingProxyIsANoOp(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	res, err := h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: h.ns, Name: "absent"}})
	if err != nil || res.RequeueAfter != 0 {
		t.Fatalf("Reconcile of a missing Proxy = %+v, %v; want nothing to do", res, err)
	}
	if ops := h.fake.Ops(); len(ops) != 0 {
		t.Errorf("provider calls: %v", ops)
	}
}

func TestSpecEditWhileTheInstanceIsAlreadyGoneCreatesWithoutDelete(t *testing.T) {
	t.Parallel()
	// No drift polls: the edit is the first pass to look at the instance.
	iv := fastIntervals()
	iv.DriftPoll = time.Hour
	h := start(t, setup{intervals: &iv})
	h.create(h.managed("px"))
	before := h.waitRunning("px")
	h.fake.Vanish(before.Status.ProviderID)
	h.edit("px", func(p *v1alpha1.Proxy) { p.Spec.Port = 3129 })
	h.waitProxy("px", "recreated on the new port", func(p *v1alpha1.Proxy) bool {
		reqs := h.fake.Creates()
		return len(reqs) == 2 && reqs[1].Port == 3129 && p.Status.IP != "" && reason(p) == v1alpha1.ReasonCreated
	})
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Errorf("Delete called %d times for an instance that was already gone", n)
	}
}

func TestCloudInitSecretWithoutTheKeyIsCloudInitError(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(cloudInitSecret(h.ns, "ci", true, "#cloud-config\n"))
	px := h.managed("px")
	px.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: &v1alpha1.SecretKeyRef{Name: "ci", Key: "vendor-data"}}
	h.create(px)
	p := h.waitProxy("px", "CloudInitError", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonCloudInitError })
	if !strings.Contains(message(p), `"vendor-data"`) {
		t.Errorf("message %q should name the missing key", message(p))
	}
	if n := h.fake.Count(providers.OpCreate); n != 0 {
		t.Errorf("Create called %d times without cloud-init", n)
	}
}

func TestMaxConcurrentReconcilesBoundsParallelPasses(t *testing.T) {
	t.Parallel()
	// Two workers, four Proxies, and a provider whose Create blocks: exactly
	// two passes can be inside Create at once. The default (3) or
	// controller-runtime's (1) would both show here.
	h := start(t, setup{maxParallel: 2})
	var mu sync.Mutex
	inFlight, most := 0, 0
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	// Registered after start, so it runs before the manager is stopped: a
	// failed assertion must not leave the workers blocked in Create.
	t.Cleanup(unblock)
	h.fake.OnCreate(func(providers.CreateRequest) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
	})
	names := []string{"px-a", "px-b", "px-c", "px-d"}
	for _, n := range names {
		h.create(h.managed(n))
	}
	snapshot := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return inFlight, most
	}
	poll.Until(h.t, wait, "two Creates blocked at once", func() error {
		now, _ := snapshot()
		return poll.Check(now == 2, "%d in flight", now)
	})
	// Both workers are busy: no third pass may start however long we wait.
	time.Sleep(500 * time.Millisecond)
	if now, top := snapshot(); now != 2 || top != 2 {
		t.Fatalf("%d Creates in flight (at most %d) with MaxConcurrentReconciles 2", now, top)
	}
	unblock()
	for _, n := range names {
		h.waitRunning(n)
	}
	if _, top := snapshot(); top != 2 {
		t.Errorf("at most %d Creates ran at once, want 2", top)
	}
}

func TestTransientCreateFailureShowsInTheCondition(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrTransient, "503 backend unavailable"))
	h.create(h.managed("px"))
	p := h.waitProxy("px", "TransientError", func(p *v1alpha1.Proxy) bool { return reason(p) == v1alpha1.ReasonTransientError })
	if !strings.Contains(message(p), "503 backend unavailable") || p.Status.Phase != v1alpha1.PhasePending {
		t.Errorf("want Pending with the provider's message while retrying: %s", describe(p))
	}
	h.fake.ClearFailures()
	h.waitRunning("px")
}

func TestTransientGetFailureKeepsARunningProxyProvisioned(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.create(h.managed("px"))
	h.waitRunning("px")
	// Let the provisioning sequence's last status write land.
	poll.Until(h.t, wait, "a steady drift poll", func() error {
		return poll.Check(h.fake.Count(providers.OpGet) >= 3, "%s", h.fake.String())
	})
	writes := h.client.statusWrites.Load()
	gets := h.fake.Count(providers.OpGet)
	h.fake.FailNext(providers.OpGet, 3, providertest.ErrClass(providers.ErrTransient, "poll timed out"))
	poll.Until(h.t, wait, "three failed polls and a good one", func() error {
		return poll.Check(h.fake.Count(providers.OpGet) >= gets+4, "%s", h.fake.String())
	})
	p := h.mustGet("px")
	if reason(p) != v1alpha1.ReasonCreated || !meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned) {
		t.Errorf("a failed poll of a running instance changed its condition: %s", describe(p))
	}
	if got := h.client.statusWrites.Load() - writes; got != 0 {
		t.Errorf("%d status writes for failed polls of a running instance, want 0 (no flapping)", got)
	}
	if errs := h.logs.errorLines(); !strings.Contains(strings.Join(errs, "\n"), "poll timed out") {
		t.Errorf("a transient Get is returned for backoff and logged; error lines: %q", errs)
	}
}
