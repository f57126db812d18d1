package controller

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// update rewrites the golden transcripts: go test ./controller -run TestReconcileManagedTranscript -update
var update = flag.Bool("update", false, "rewrite controller/testdata/*.golden from this run")

// transcript drives the Proxy reconciler one pass at a time, with no manager
// and no cache (reads go straight to the real API server), so every pass and
// every provider call is in a fixed order, and writes down each pass: the
// provider calls it made, its result, and the Proxy's phase and Provisioned
// reason after it (without a health source a running Proxy stays in phase
// Provisioning: Ready needs a Healthy verdict). Instance names derive from the Proxy's UID, which differs
// each run; they are written as <instance>.
type transcript struct {
	t    *testing.T
	r    *ProxyReconciler
	fake *providertest.Provider
	key  types.NamespacedName
	seen int // provider calls already written
	b    strings.Builder
}

func newTranscript(t *testing.T, name string) *transcript {
	t.Helper()
	fake := providertest.New()
	ns := env.Namespace(t)
	return &transcript{
		t:    t,
		fake: fake,
		key:  types.NamespacedName{Namespace: ns, Name: name},
		r: &ProxyReconciler{
			Client:       env.Client,
			Providers:    map[string]providers.Provider{fakeName: fake},
			Installation: testInstallation,
			// Distinct intervals, so a result names the wait it chose.
			Intervals: Intervals{RequeueNow: time.Millisecond, ProvisioningPoll: 2 * time.Millisecond,
				DeletionPoll: 3 * time.Millisecond, DriftPoll: 4 * time.Millisecond, QuotaRetry: time.Hour},
		},
	}
}

// proxy is the Managed Proxy the transcript reconciles.
func (tr *transcript) proxy() *v1alpha1.Proxy {
	return gen.Proxy(tr.key.Name, gen.SetProxyNamespace(tr.key.Namespace), gen.SetProxyManaged(fakeName),
		gen.SetProxyPlacement(v1alpha1.Placement{Zone: "zone-a", MachineType: "small", Image: "squid"}))
}

func (tr *transcript) get() *v1alpha1.Proxy {
	tr.t.Helper()
	var p v1alpha1.Proxy
	if err := env.Client.Get(context.Background(), tr.key, &p); err != nil {
		tr.t.Fatalf("get %s: %v", tr.key, err)
	}
	return &p
}

// note writes a line saying what the test did between passes.
func (tr *transcript) note(format string, args ...any) {
	fmt.Fprintf(&tr.b, "# "+format+"\n", args...)
}

// pass runs one Reconcile and writes it down.
func (tr *transcript) pass() {
	tr.t.Helper()
	res, err := tr.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: tr.key})
	p := tr.get()
	instance := providers.NameFromUID(string(p.UID))
	all := tr.fake.Calls()
	calls := all[tr.seen:]
	tr.seen = len(all)
	var ops []string
	for _, c := range calls {
		arg := strings.ReplaceAll(c.Arg, instance, "<instance>")
		if c.Op == providers.OpCreate {
			arg += fmt.Sprintf(" zone=%s image=%s", c.Req.Placement.Zone, c.Req.Placement.Image)
		}
		ops = append(ops, c.Op+"("+arg+")")
	}
	if len(ops) == 0 {
		ops = []string{"-"}
	}
	reason := "-"
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		reason = string(c.Status) + "/" + c.Reason
	}
	outcome := tr.requeue(res)
	if err != nil {
		outcome = "error (retried with backoff)"
	}
	fmt.Fprintf(&tr.b, "pass: calls %s | %s | phase %s, provisioned %s, ip %q\n",
		strings.Join(ops, " "), outcome, orDash(string(p.Status.Phase)), reason, p.Status.IP)
}

// requeue names a result by the interval it waits.
func (tr *transcript) requeue(res ctrl.Result) string {
	iv := tr.r.Intervals
	switch res.RequeueAfter {
	case 0:
		return "done"
	case iv.RequeueNow:
		return "requeue now"
	case iv.ProvisioningPoll:
		return "requeue after the provisioning poll"
	case iv.DeletionPoll:
		return "requeue after the deletion poll"
	case iv.DriftPoll:
		return "requeue after the drift poll"
	case iv.QuotaRetry:
		return "requeue after the quota retry"
	}
	return "requeue after " + res.RequeueAfter.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// check compares the transcript with testdata/<name>.golden, or rewrites
// the file with -update.
func (tr *transcript) check(name string) {
	tr.t.Helper()
	path := filepath.Join("testdata", "reconcile_managed_"+name+".golden")
	got := tr.b.String()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			tr.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tr.t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		tr.t.Errorf("reconcileManaged's provider calls changed (%s); if that is intended, rerun with -update and review the diff.\n--- want\n%s--- got\n%s", path, want, got)
	}
}

// TestReconcileManagedTranscript pins the sequence of provider calls and
// results of reconcileManaged's main paths against golden transcripts, so a
// change to the state machine's calls shows up as a reviewed diff.
func TestReconcileManagedTranscript(t *testing.T) {
	t.Parallel()
	quota := providertest.ErrClass(providers.ErrQuotaExceeded, "no CPUs left in the region")
	permanent := providertest.ErrClass(providers.ErrPermanent, "the image does not exist")
	tests := []struct {
		name string
		run  func(tr *transcript)
	}{
		{name: "create", run: func(tr *transcript) {
			tr.note("a new Managed Proxy whose instance starts provisioning")
			tr.fake.SetStartState(providers.StateProvisioning)
			tr.createProxy()
			tr.passes(2)
			tr.note("the instance runs")
			tr.fake.SetState(providertest.ProviderID(providers.NameFromUID(string(tr.get().UID))), providers.StateRunning)
			tr.passes(2)
		}},
		{name: "adopt", run: func(tr *transcript) {
			tr.note("a Proxy whose status names a running instance, without a spec hash")
			p := tr.proxy()
			p.Finalizers = []string{v1alpha1.Finalizer}
			tr.create(p)
			name := providers.NameFromUID(string(p.UID))
			tr.fake.Put(providers.Instance{ProviderID: providertest.ProviderID(name), Name: name, State: providers.StateRunning, IP: "127.0.10.200", OwnerUID: string(p.UID)})
			p.Status.ProviderID = providertest.ProviderID(name)
			if err := env.Client.Status().Update(context.Background(), p); err != nil {
				tr.t.Fatalf("seeding status: %v", err)
			}
			tr.passes(2)
		}},
		{name: "replace", run: func(tr *transcript) {
			tr.createRunning()
			tr.note("the zone is edited: the instance is replaced under the same name")
			tr.edit(func(p *v1alpha1.Proxy) { p.Spec.Placement.Zone = "zone-b" })
			tr.passes(7)
		}},
		{name: "cattle", run: func(tr *transcript) {
			tr.createRunning()
			tr.note("the instance stops: it is deleted and created again, not restarted")
			tr.fake.SetState(providertest.ProviderID(providers.NameFromUID(string(tr.get().UID))), providers.StateStopped)
			tr.passes(6)
		}},
		{name: "quota_wait", run: func(tr *transcript) {
			tr.note("the provider is out of quota for two creates")
			tr.fake.FailNext(providers.OpCreate, 2, quota)
			tr.createProxy()
			tr.passes(3)
			tr.note("quota is back")
			tr.passes(2)
		}},
		{name: "permanent_latch", run: func(tr *transcript) {
			tr.note("the provider refuses the create for good")
			tr.fake.FailAlways(providers.OpCreate, permanent)
			tr.createProxy()
			tr.passes(2)
			tr.note("latched: further passes call nothing until the spec changes")
			tr.fake.ClearFailures()
			tr.passes(2)
			tr.note("the image is edited: a new generation is tried")
			tr.edit(func(p *v1alpha1.Proxy) { p.Spec.Placement.Image = "squid-2" })
			tr.passes(3)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newTranscript(t, "px")
			tc.run(tr)
			tr.check(tc.name)
		})
	}
}

func (tr *transcript) create(p *v1alpha1.Proxy) {
	tr.t.Helper()
	if err := env.Client.Create(context.Background(), p); err != nil {
		tr.t.Fatalf("create: %v", err)
	}
}

func (tr *transcript) createProxy() { tr.create(tr.proxy()) }

// createRunning creates the Proxy and passes until its instance runs.
func (tr *transcript) createRunning() {
	tr.note("a new Managed Proxy; its instance runs at once")
	tr.createProxy()
	tr.passes(3)
}

func (tr *transcript) passes(n int) {
	tr.t.Helper()
	for range n {
		tr.pass()
	}
}

// edit changes the Proxy's spec on the API server.
func (tr *transcript) edit(mutate func(*v1alpha1.Proxy)) {
	tr.t.Helper()
	p := tr.get()
	mutate(p)
	if err := env.Client.Update(context.Background(), p); err != nil {
		tr.t.Fatalf("edit: %v", err)
	}
}
