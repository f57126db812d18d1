package controller

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// staleReads answers a Get of one Proxy with a copy of an older version of
// it, as the manager's cache does until it has seen the latest write;
// everything else goes to the API server.
type staleReads struct {
	client.Client
	stale *v1alpha1.Proxy
}

func (s staleReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if p, ok := obj.(*v1alpha1.Proxy); ok && key == client.ObjectKeyFromObject(s.stale) {
		s.stale.DeepCopyInto(p)
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// TestAPassThatReadAnOutdatedProxyWritesNothing pins what a pass does when
// the cache hands it a Proxy older than the stored one: its status write is
// refused and it comes back soon, rather than writing its stale view over a
// newer one (a merge patch replaces the conditions list whole), and it
// creates no instance on a read that has not seen the providerID of the one
// that exists. Each pass is driven by hand (no manager), the stale read
// injected, so the interleaving a busy machine produces now and then happens
// every run.
func TestAPassThatReadAnOutdatedProxyWritesNothing(t *testing.T) {
	t.Parallel()
	permanent := providertest.ErrClass(providers.ErrPermanent, "403 forbidden")
	tests := []struct {
		name string
		// staleAfter is how many passes the stale copy has seen.
		staleAfter int
		// before runs just ahead of the stale pass.
		before func(tr *transcript, health *fakeHealth)
		// after checks the Proxy once a pass from a current read ran.
		after func(t *testing.T, p *v1alpha1.Proxy)
	}{
		{
			// The copy predates the address and the Healthy verdict; the
			// stale pass hits a permanent error and would latch the Proxy
			// Failed with the verdict gone, and no later pass would bring
			// it back until the spec changed.
			name: "a newer verdict is not overwritten by a pass latched Failed from an old read", staleAfter: 2,
			before: func(tr *transcript, health *fakeHealth) {
				tr.fake.FailNext(providers.OpGet, 1, permanent)
				health.set(tr.key, HealthSnapshot{Known: true, Healthy: false, Message: "dial tcp: connection refused"})
			},
			after: func(t *testing.T, p *v1alpha1.Proxy) {
				c := p.Condition(v1alpha1.ConditionHealthy)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonProbeFailed {
					t.Errorf("the probe's verdict did not reach status: %s", describe(p))
				}
			},
		},
		{
			// The copy has the spec hash and the finalizer but not the
			// providerID the create pass wrote: a pass from it would create
			// a second time.
			name: "no second create from a read that has not seen the providerID", staleAfter: 1,
			before: func(*transcript, *fakeHealth) {},
			after: func(t *testing.T, p *v1alpha1.Proxy) {
				if p.Status.ProviderID == "" || !p.IsHealthy() {
					t.Errorf("the Proxy lost its instance: %s", describe(p))
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newTranscript(t, "px")
			health := &fakeHealth{}
			health.set(tr.key, HealthSnapshot{Known: true, Healthy: true, Message: "200"})
			tr.r.Health = health
			tr.r.apiReader = env.Client
			tr.createProxy()
			var stale *v1alpha1.Proxy
			for i := range 3 {
				if i == tc.staleAfter {
					stale = tr.get()
				}
				tr.pass()
			}
			if p := tr.get(); p.Status.Phase != v1alpha1.PhaseReady {
				t.Fatalf("setup: the Proxy is not Ready after three passes: %s", describe(p))
			}
			tc.before(tr, health)
			stored := tr.get()
			creates := countCalls(tr.fake, providers.OpCreate)

			live := tr.r.Client
			tr.r.Client = staleReads{Client: live, stale: stale}
			res, err := tr.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: tr.key})
			tr.r.Client = live
			if err != nil || res.RequeueAfter != tr.r.Intervals.RequeueNow {
				t.Errorf("the stale pass returned %+v, %v; want a quiet requeue after RequeueNow", res, err)
			}
			if got := tr.get(); !equality.Semantic.DeepEqual(got.Status, stored.Status) {
				t.Errorf("the stale pass wrote its view over a newer one:\nstored %s\nnow    %s", describe(stored), describe(got))
			}
			if n := countCalls(tr.fake, providers.OpCreate); n != creates {
				t.Errorf("the stale pass created an instance again (%d creates, want %d)", n, creates)
			}

			tr.pass()
			tc.after(t, tr.get())
		})
	}
}

// countCalls counts the provider calls of one kind so far.
func countCalls(f *providertest.Provider, op string) int {
	n := 0
	for _, c := range f.Calls() {
		if c.Op == op {
			n++
		}
	}
	return n
}
