// Package controller holds proxyfleet's reconcilers and their manager wiring.
// The Proxy reconciler keeps one upstream proxy alive per Proxy object: it
// creates the instance through a provider, replaces it when the spec or its
// cloud-init changes, recreates it when it dies, deletes it behind a finalizer,
// and is the only writer of Proxy status.
//
// It imports api/v1alpha1, providers, pool, statuspage, internal/logging and
// its own sub-packages; never gateway, cmd or a provider implementation (they
// reach it through the providers contract).
package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/providers"
)

// secretRefIndex is the field index over spec.cloudInit.secretRef.name that
// lets a Secret event find the Proxies referencing it without a full scan.
const secretRefIndex = "spec.cloudInit.secretRef.name"

// credentialsRefIndex is the field index over
// spec.endpoint.credentialsSecretRef.name: a credentials Secret event finds
// the External Proxies whose login it holds.
const credentialsRefIndex = "spec.endpoint.credentialsSecretRef.name"

// Intervals are the reconciler's requeue delays. Each is a flag so tests can
// shrink them.
type Intervals struct {
	// RequeueNow is the short delay used where the next pass must come at
	// once (after adopting, or once an instance is known to be gone). It
	// replaces the deprecated ctrl.Result.Requeue.
	RequeueNow time.Duration
	// ProvisioningPoll is how often an instance that is still coming up is
	// polled until it runs.
	ProvisioningPoll time.Duration
	// DeletionPoll is how often a deleted instance is polled until the
	// provider reports it gone.
	DeletionPoll time.Duration
	// DriftPoll is how often a running instance is re-checked, so a stopped
	// or vanished one is noticed without any provider-side watch.
	DriftPoll time.Duration
	// QuotaRetry is how long a Proxy waits after the provider reported its
	// quota exhausted; a wait, not an error.
	QuotaRetry time.Duration
}

// DefaultIntervals returns the production requeue delays.
func DefaultIntervals() Intervals {
	return Intervals{
		RequeueNow:       time.Second,
		ProvisioningPoll: 10 * time.Second,
		DeletionPoll:     5 * time.Second,
		DriftPoll:        60 * time.Second,
		QuotaRetry:       5 * time.Minute,
	}
}

// Validate reports the first interval that is not positive, naming it by its
// flag, so the controller command can return the error as it is.
func (iv Intervals) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"requeue-now", iv.RequeueNow},
		{"provisioning-poll", iv.ProvisioningPoll},
		{"deletion-poll", iv.DeletionPoll},
		{"drift-poll", iv.DriftPoll},
		{"quota-retry", iv.QuotaRetry},
	} {
		if f.d <= 0 {
			return fmt.Errorf("--%s must be a positive duration, got %s", f.name, f.d)
		}
	}
	return nil
}

// HealthSnapshot is the health engine's reported verdict for one Proxy
// (health.Verdict, the one type for it), which the reconciler copies into
// status: the engine owns health state, the reconciler its representation.
// Known false means the engine tracks the Proxy but has no verdict for its
// current address (not probed yet, no probe URL): any Healthy condition in
// status is stale and is removed.
type HealthSnapshot = health.Verdict

// HealthSource is what the reconciler reads health verdicts from. The health
// engine implements it; nil means no health is represented in status.
type HealthSource interface {
	// Snapshot returns the verdict for a Proxy, false when the source does
	// not track it (status is then left alone). *health.Engine implements it.
	Snapshot(key types.NamespacedName) (HealthSnapshot, bool)
}

// ProxyReconciler drives Proxy objects to their desired state. It is the only
// writer of Proxy status.
type ProxyReconciler struct {
	// Client reads from the manager cache and writes to the API server.
	Client client.Client
	// Providers maps a provider name (spec.provider) to its implementation.
	// Nil means no providers config was given: only External Proxies can be
	// served and Managed ones fail with a condition saying so.
	Providers map[string]providers.Provider
	// Installation is this installation's ID (InstallationID), stamped on
	// every instance created so the orphan GC of another installation
	// sharing a provider's backend never deletes it. Required with
	// Providers.
	Installation string
	// Intervals are the requeue delays.
	Intervals Intervals
	// MaxConcurrentReconciles bounds parallel reconciles (default 3).
	MaxConcurrentReconciles int
	// HealthEvents, when set, re-enqueues the Proxy named by each event; the
	// health engine sends one on every status-affecting verdict.
	HealthEvents <-chan event.GenericEvent
	// Health, when set, supplies the verdicts staged into status.
	Health HealthSource
	// Credentials is the cache of credentials Secrets (labelled
	// proxyfleet.io/credentials: "true"); SetupWithManager takes the
	// manager's (see NewManager) when it is nil. Its Secret events re-enqueue
	// the Proxies whose login they hold.
	Credentials cache.Cache
	// apiReader confirms a credentials cache miss before a login is
	// generated; the manager's API reader.
	apiReader client.Reader
	// SkipNameValidation lets tests start several managers in one process,
	// each with its own Proxy controller.
	SkipNameValidation bool
}

// SetupWithManager registers the reconciler and its watches: Proxies, the
// labelled cloud-init Secrets they reference, and the health event channel.
func (r *ProxyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Credentials == nil {
		r.Credentials = CredentialsCacheOf(mgr)
	}
	if r.Credentials == nil {
		return errors.New("the Proxy reconciler needs the credentials Secret cache: build the manager with controller.NewManager or set ProxyReconciler.Credentials")
	}
	r.apiReader = mgr.GetAPIReader()
	if r.Providers != nil && r.Installation == "" {
		return errors.New("the Proxy reconciler needs ProxyReconciler.Installation (InstallationID) to tag the instances it creates")
	}
	if r.Intervals == (Intervals{}) {
		r.Intervals = DefaultIntervals()
	}
	if err := r.Intervals.Validate(); err != nil {
		return err
	}
	if r.MaxConcurrentReconciles <= 0 {
		r.MaxConcurrentReconciles = 3
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Proxy{}, secretRefIndex, indexSecretRef); err != nil {
		return fmt.Errorf("indexing Proxies by cloud-init Secret: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Proxy{}, credentialsRefIndex, func(o client.Object) []string {
		if p, ok := o.(*v1alpha1.Proxy); ok && p.CredentialsSecretName() != "" {
			return []string{p.CredentialsSecretName()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing Proxies by credentials Secret: %w", err)
	}
	opts := controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}
	if r.SkipNameValidation {
		skip := true
		opts.SkipNameValidation = &skip
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("proxy").
		For(&v1alpha1.Proxy{}, builder.WithPredicates(ignoreStatusOnlyUpdates())).
		// The cache holds only Secrets labelled proxyfleet.io/cloud-init=true
		// (see NewManager), so this watch sees exactly the usable ones; a
		// Secret losing the label arrives as a delete.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesForSecret)).
		// The credentials cache holds only Secrets labelled
		// proxyfleet.io/credentials=true: a generated login that changes or
		// vanishes re-enqueues its Proxy.
		WatchesRawSource(source.Kind(r.Credentials, &corev1.Secret{},
			handler.TypedEnqueueRequestsFromMapFunc(r.proxiesForCredentials))).
		WithOptions(opts)
	if r.HealthEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.HealthEvents, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(traced(SpanReconcileProxy, r))
}

// ignoreStatusOnlyUpdates drops Proxy update events that changed nothing but
// status (and the bookkeeping that comes with it): this reconciler is the only
// status writer, so such an event is its own write echoing back, and acting
// on it would only repeat the provider call the previous pass just made. Spec
// edits, annotations (skip-cleanup, spec-hash), labels, finalizers and the
// deletion timestamp still trigger a pass.
func ignoreStatusOnlyUpdates() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		if o == nil || n == nil {
			return true
		}
		return o.GetGeneration() != n.GetGeneration() ||
			!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
			!maps.Equal(o.GetLabels(), n.GetLabels()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
			!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
	}}
}

// indexSecretRef extracts the referenced cloud-init Secret name for the index.
func indexSecretRef(obj client.Object) []string {
	p, ok := obj.(*v1alpha1.Proxy)
	if !ok {
		return nil
	}
	if name := secretRefName(p); name != "" {
		return []string{name}
	}
	return nil
}

// proxiesForSecret maps a Secret event to every Proxy in its namespace whose
// cloud-init references it, so rotating the Secret replaces their instances.
func (r *ProxyReconciler) proxiesForSecret(ctx context.Context, obj client.Object) []reconcile.Request {
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace()),
		client.MatchingFields{secretRefIndex: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing Proxies for a cloud-init Secret", "secret", client.ObjectKeyFromObject(obj))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// proxiesForCredentials maps a credentials Secret event to the Proxy that
// controls it (a generated login) and to the External Proxies in its
// namespace that name it in spec.endpoint.credentialsSecretRef.
func (r *ProxyReconciler) proxiesForCredentials(ctx context.Context, s *corev1.Secret) []reconcile.Request {
	var reqs []reconcile.Request
	if ref := metav1.GetControllerOf(s); ref != nil && ref.Kind == "Proxy" && ref.APIVersion == v1alpha1.GroupVersion.String() {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: ref.Name}})
	}
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(s.Namespace),
		client.MatchingFields{credentialsRefIndex: s.Name}); err != nil {
		log.FromContext(ctx).Error(err, "listing Proxies for a credentials Secret", "secret", client.ObjectKeyFromObject(s))
		return reqs
	}
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// Reconcile fetches the Proxy, dispatches on deletion and mode, and writes
// status once at the end, only when it changed.
func (r *ProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	var p v1alpha1.Proxy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := p.DeepCopy()
	defer func() {
		perr := r.patchStatusIfChanged(ctx, base, &p)
		switch {
		case errors.Is(perr, errStaleRead) && err == nil:
			// Not an error: the cache lags behind a write. Come back
			// soon, from an object that has caught up.
			log.FromContext(ctx).V(1).Info("status write refused: the Proxy changed since it was read; requeueing")
			res = ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}
		case perr != nil:
			err = errors.Join(err, perr)
		}
	}()

	switch {
	case !p.DeletionTimestamp.IsZero():
		return r.reconcileDelete(ctx, &p)
	case p.IsExternal():
		return r.reconcileExternal(ctx, &p)
	default:
		return r.reconcileManaged(ctx, &p)
	}
}

// patchMeta writes metadata changes made by mutate (finalizer, annotations)
// as a merge patch, keeping the status staged so far (the response carries
// the stored status, which would overwrite what this pass computed). A patch
// without optimistic locking: the deferred status write of the previous pass
// moves resourceVersion, so an Update from a cache that has not seen it yet
// would fail with a conflict for no reason.
func (r *ProxyReconciler) patchMeta(ctx context.Context, p *v1alpha1.Proxy, mutate func(p *v1alpha1.Proxy)) error {
	staged := p.Status.DeepCopy()
	before := p.DeepCopy()
	mutate(p)
	err := r.Client.Patch(ctx, p, client.MergeFrom(before))
	p.Status = *staged
	return err
}

// loggerFor returns the controller-runtime logger from ctx with the Proxy's
// provider attached.
func loggerFor(ctx context.Context, p *v1alpha1.Proxy) logr.Logger {
	return log.FromContext(ctx).WithValues("provider", p.Spec.Provider, "providerID", p.Status.ProviderID)
}
