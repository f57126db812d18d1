package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// DefaultGrantRecheck is how often a ProxyGrant that names something
// missing is looked at again: a namespace's creation makes no event the
// controller watches (it may only get namespaces, not watch them), so its
// Resolved condition follows within this.
const DefaultGrantRecheck = time.Minute

// ProxyGrantReconciler writes each ProxyGrant's Resolved condition: whether
// the namespaces of spec.to and the pools of spec.pools exist. The API
// server cannot tell (a CRD validates one object at a time), so a grant
// with a typing error in a namespace name is accepted, and this condition
// is where its owner learns it. The lease API does not need the
// condition: it reads the grants themselves.
type ProxyGrantReconciler struct {
	// Client writes the status.
	Client client.Client
	// Reader gets Namespaces and ProxyPools from the API server directly:
	// the controller may get a namespace but not list or watch them.
	Reader client.Reader
	// Recheck is how soon a grant naming something missing is looked at
	// again (DefaultGrantRecheck for zero).
	Recheck time.Duration
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// SetupWithManager registers the reconciler for ProxyGrants.
func (r *ProxyGrantReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	if r.Recheck == 0 {
		r.Recheck = DefaultGrantRecheck
	}
	opts := controller.Options{}
	if r.SkipNameValidation {
		opts.SkipNameValidation = &r.SkipNameValidation
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxygrant").
		For(&v1alpha1.ProxyGrant{}, builder.WithPredicates(ignoreStatusOnlyUpdates())).
		WithOptions(opts).
		Complete(r)
}

// Reconcile checks what the grant names and writes Resolved.
func (r *ProxyGrantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var g v1alpha1.ProxyGrant
	if err := r.Reader.Get(ctx, req.NamespacedName, &g); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !g.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	var missingNS, missingPools []string
	for _, s := range g.Spec.To {
		err := r.Reader.Get(ctx, types.NamespacedName{Name: s.Namespace}, &corev1.Namespace{})
		switch {
		case apierrors.IsNotFound(err):
			missingNS = append(missingNS, s.Namespace)
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("getting namespace %s: %w", s.Namespace, err)
		}
	}
	for _, p := range g.Spec.Pools {
		err := r.Reader.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: p}, &v1alpha1.ProxyPool{})
		switch {
		case apierrors.IsNotFound(err):
			missingPools = append(missingPools, p)
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("getting ProxyPool %s/%s: %w", g.Namespace, p, err)
		}
	}
	cond := resolvedCondition(g.Namespace, slices.Compact(missingNS), slices.Compact(missingPools))
	cond.ObservedGeneration = g.Generation
	before := g.DeepCopy()
	meta.SetStatusCondition(&g.Status.Conditions, cond)
	g.Status.ObservedGeneration = g.Generation
	if err := r.Client.Status().Patch(ctx, &g, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cond.Status != metav1.ConditionTrue {
		return ctrl.Result{RequeueAfter: r.Recheck}, nil
	}
	return ctrl.Result{}, nil
}

// resolvedCondition says what of a grant in namespace ns is missing.
func resolvedCondition(ns string, missingNS, missingPools []string) metav1.Condition {
	switch {
	case len(missingNS) > 0:
		msg := fmt.Sprintf("namespace %s in spec.to does not exist: no pod there can lease through this grant until it is created", strings.Join(missingNS, ", "))
		if len(missingPools) > 0 {
			msg += fmt.Sprintf("; ProxyPool %s in spec.pools does not exist in namespace %s", strings.Join(missingPools, ", "), ns)
		}
		return metav1.Condition{Type: v1alpha1.ConditionResolved, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNamespaceNotFound, Message: msg}
	case len(missingPools) > 0:
		return metav1.Condition{Type: v1alpha1.ConditionResolved, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotFound,
			Message: fmt.Sprintf("ProxyPool %s in spec.pools does not exist in namespace %s: nothing of it is shared until it is created", strings.Join(missingPools, ", "), ns)}
	}
	return metav1.Condition{Type: v1alpha1.ConditionResolved, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllFound,
		Message: "every namespace of spec.to and pool of spec.pools exists"}
}
