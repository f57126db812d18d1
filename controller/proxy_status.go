package controller

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// errStaleRead says the API server refused a status write because the Proxy
// changed after this pass read it: the manager's cache had not yet seen a
// write (most often this reconciler's own previous one). Reconcile turns it
// into a quiet requeue; the next pass reads the newer object.
var errStaleRead = errors.New("the Proxy changed since this pass read it")

// patchStatusIfChanged is the one place Proxy status is written. It stamps the
// observed generation and the phase derived from the conditions, and patches
// the status subresource only when the result differs from what was read at
// the start of the reconcile, so a steady Proxy costs no API writes.
//
// The patch carries the resourceVersion the pass read (optimistic locking).
// A merge patch replaces the conditions list whole, so a pass that read a
// cached object older than the stored one would otherwise write its stale
// view back: a Healthy condition another pass had just set would vanish and,
// with the spec latched Failed, no later pass would restore it. Such a write
// is refused (errStaleRead) instead. What the refused pass learnt from the
// provider is learnt again by the next one: the only fact it cannot look up
// again, the providerID of an instance it just created, is guarded in
// createInstance, and Create is idempotent by name besides.
func (r *ProxyReconciler) patchStatusIfChanged(ctx context.Context, base, p *v1alpha1.Proxy) error {
	if !p.DeletionTimestamp.IsZero() && len(p.Finalizers) == 0 {
		// The last finalizer is gone, so the object is gone with it.
		return nil
	}
	p.Status.ObservedGeneration = p.Generation
	p.Status.Phase = computePhase(p)
	if equality.Semantic.DeepEqual(base.Status, p.Status) {
		return nil
	}
	// Diff status only: metadata changes went through patchMeta already.
	from := p.DeepCopy()
	from.Status = base.Status
	err := r.Client.Status().Patch(ctx, p, client.MergeFromWithOptions(from, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return errStaleRead
	}
	return client.IgnoreNotFound(err)
}

// setProvisioned stages the Provisioned condition for this generation.
func setProvisioned(p *v1alpha1.Proxy, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionProvisioned,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: p.Generation,
	})
}

// latched reports whether this generation already failed permanently: the
// reconciler stays silent until a spec edit bumps the generation. A missing
// provider is not latched: it is re-checked on every pass (no provider call),
// so a controller restarted with the provider configured picks the Proxy up.
func latched(p *v1alpha1.Proxy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	return c != nil && c.Status == metav1.ConditionFalse &&
		c.Reason == v1alpha1.ReasonPermanentError && c.ObservedGeneration == p.Generation
}

// clearInstance forgets the instance in status: its ID, its address and the
// health verdict that belonged to it. A replacement starts fresh.
func clearInstance(p *v1alpha1.Proxy) {
	p.Status.ProviderID = ""
	p.Status.IP = ""
	clearHealth(p)
}

// clearHealth drops the health representation of an address that is gone.
func clearHealth(p *v1alpha1.Proxy) {
	meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionHealthy)
	p.Status.LatencyMillis = 0
	p.Status.LastHealthCheckTime = nil
}

// applyHealth stages the health engine's verdict for a Proxy that has an
// address. When the engine does not track the Proxy yet it leaves status
// alone, so a restart does not flap a healthy fleet to unknown before the
// engine's first round; when the engine tracks it without a verdict
// (Known false) the stale Healthy condition is removed.
func (r *ProxyReconciler) applyHealth(p *v1alpha1.Proxy) {
	if r.Health == nil || p.Status.IP == "" {
		return
	}
	snap, ok := r.Health.Snapshot(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
	if !ok {
		return
	}
	if !snap.Known {
		clearHealth(p)
		return
	}
	status, reason := metav1.ConditionFalse, v1alpha1.ReasonProbeFailed
	if snap.Healthy {
		status, reason = metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded
	}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionHealthy,
		Status:             status,
		Reason:             reason,
		Message:            snap.Message,
		ObservedGeneration: p.Generation,
	})
	p.Status.LatencyMillis = latencyMillis(snap.Latency)
	if !snap.CheckedAt.IsZero() {
		t := metav1.NewTime(snap.CheckedAt)
		p.Status.LastHealthCheckTime = &t
	}
}

// latencyMillis rounds up, so a healthy proxy answering in under a
// millisecond shows 1 rather than an absent (zero) latency.
func latencyMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// isNotFound reports an API NotFound, kept here so callers read clearly.
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
