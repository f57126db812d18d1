package controller

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

// reconcileDelete removes the instance behind the finalizer, then releases the
// object. It never latches: a permanent failure keeps retrying visibly,
// because dropping the finalizer on its own would leak a running instance.
// The skip-cleanup annotation is the manual way out; it is checked before the
// provider lookup, so it also frees a Proxy whose provider left the config.
func (r *ProxyReconciler) reconcileDelete(ctx context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if p.SkipCleanup() {
		loggerFor(ctx, p).Info("WARNING: skip-cleanup set; releasing the Proxy without deleting its instance")
		return r.releaseFinalizer(ctx, p)
	}
	if p.Status.ProviderID == "" {
		return r.deleteUnrecorded(ctx, p)
	}
	if r.Providers == nil || r.Providers[p.Spec.Provider] == nil {
		msg := fmt.Sprintf("cannot delete instance %s: provider %q is not configured; set the annotation %s: \"true\" to release the Proxy without cleanup",
			p.Status.ProviderID, p.Spec.Provider, v1alpha1.AnnotationSkipCleanup)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, msg)
		return ctrl.Result{}, errors.New(msg)
	}
	prov := r.Providers[p.Spec.Provider]

	_, getErr := prov.Get(ctx, p.Status.ProviderID)
	switch providers.Class(getErr) {
	case nil:
	case providers.ErrNotFound:
		return r.releaseFinalizer(ctx, p)
	case providers.ErrPermanent:
		// Get may never converge (a host removed from the config, an ID the
		// provider cannot resolve), but Delete is idempotent and may still
		// finish: try it, and release the object when it succeeds.
		if err := prov.Delete(ctx, p.Status.ProviderID); err != nil {
			return r.deleteFailure(ctx, p, err)
		}
		loggerFor(ctx, p).Info("instance deleted although Get failed permanently", "getError", getErr.Error())
		return r.releaseFinalizer(ctx, p)
	default:
		return r.deleteFailure(ctx, p, getErr)
	}
	if err := prov.Delete(ctx, p.Status.ProviderID); err != nil {
		return r.deleteFailure(ctx, p, err)
	}
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonDeleting, "deleting the instance")
	return ctrl.Result{RequeueAfter: r.Intervals.DeletionPoll}, nil
}

// deleteUnrecorded handles a Proxy that never recorded a providerID. A
// Create may still have made something: the process died after the
// backend accepted it, its answer was lost, or it failed half way and could
// not undo. The provider is asked to delete by the providerID Create would
// have used, and that ID is recorded, so the next pass polls it to
// NotFound as any deletion. A provider that cannot derive IDs, or a
// placement that never named an instance, releases the Proxy at once (the
// orphan GC remains the net), as does a provider no longer configured.
func (r *ProxyReconciler) deleteUnrecorded(ctx context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	prov, ok := r.Providers[p.Spec.Provider]
	if !ok || prov == nil {
		return r.releaseFinalizer(ctx, p)
	}
	id, derivable, err := providers.ProviderIDFor(prov, createRequest(p, nil, nil))
	if !derivable || err != nil {
		return r.releaseFinalizer(ctx, p)
	}
	if err := prov.Delete(ctx, id); err != nil {
		p.Status.ProviderID = id
		return r.deleteFailure(ctx, p, err)
	}
	loggerFor(ctx, p).V(1).Info("deleting by the derived providerID whatever a Create may have left", "derivedProviderID", id)
	p.Status.ProviderID = id
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonDeleting, "deleting whatever a Create left under "+id)
	return ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}, nil
}

// releaseFinalizer deletes the Proxy's generated login, if it has one, and
// drops the finalizer; the API server then deletes the object.
func (r *ProxyReconciler) releaseFinalizer(ctx context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	if err := r.deleteCredentials(ctx, p); err != nil {
		return ctrl.Result{}, err
	}
	err := r.patchMeta(ctx, p, func(p *v1alpha1.Proxy) { controllerutil.RemoveFinalizer(p, v1alpha1.Finalizer) })
	return ctrl.Result{}, client.IgnoreNotFound(err)
}

// deleteFailure handles a provider error during deletion. Quota waits as on
// the live path; everything else, permanent included, is retried with
// backoff and shown in the condition, never latched.
func (r *ProxyReconciler) deleteFailure(ctx context.Context, p *v1alpha1.Proxy, err error) (ctrl.Result, error) {
	msg := fmt.Sprintf("deleting instance %s: %v", p.Status.ProviderID, err)
	if providers.Class(err) == providers.ErrQuotaExceeded {
		loggerFor(ctx, p).Info("provider quota exhausted during delete; waiting", "retryAfter", r.Intervals.QuotaRetry)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, msg)
		return ctrl.Result{RequeueAfter: r.Intervals.QuotaRetry}, nil
	}
	retry := " (retrying)"
	if providers.Class(err) == providers.ErrPermanent {
		// Retrying will not help by itself; say how to let the object go.
		retry = " (retrying; to abandon the instance and release this Proxy, annotate it " +
			v1alpha1.AnnotationSkipCleanup + "=" + v1alpha1.ValueTrue + ")"
	}
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonDeleting, msg+retry)
	return ctrl.Result{}, fmt.Errorf("deleting instance %s: %w", p.Status.ProviderID, err)
}
