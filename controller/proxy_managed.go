package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

// reconcileManaged is the state machine of a Managed Proxy. Every
// provider call's error goes through providerFailure, which decides between a
// quota wait, a permanent latch and a retry with backoff.
func (r *ProxyReconciler) reconcileManaged(ctx context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	// The finalizer goes on before anything exists outside the cluster, so an
	// instance is never created for an object that could vanish without
	// cleanup. A new Proxy gets it in createInstance's one metadata write,
	// with the spec hash; one whose instance exists but lost the finalizer
	// gets it back here first. The patch's watch event brings the next pass.
	if !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) && p.Status.ProviderID != "" {
		return ctrl.Result{}, r.patchMeta(ctx, p, func(p *v1alpha1.Proxy) {
			controllerutil.AddFinalizer(p, v1alpha1.Finalizer)
		})
	}
	// The health verdict is about the address, not the provider's API: it is
	// applied on every pass, before anything that can stop one, so a Proxy
	// the probe finds down stops being leased while its hypervisor or cloud
	// API cannot be asked (or its spec is latched Failed).
	r.applyHealth(p)
	if latched(p) {
		return ctrl.Result{}, nil
	}
	prov, ok := r.lookupProvider(p)
	if !ok {
		return ctrl.Result{}, nil
	}
	cloudInit, err := r.resolveCloudInit(ctx, p)
	if err != nil {
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonCloudInitError, err.Error())
		return ctrl.Result{}, err
	}
	var login *providers.BasicAuth
	if len(cloudInit) == 0 && providers.RequiresProxyAuth(prov) {
		// The provider's own bootstrap runs a proxy reachable from outside
		// the cluster: it gets a login of its own, never an open Squid.
		if login, err = r.ensureCredentials(ctx, p); err != nil {
			setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonCredentialsError, err.Error())
			return ctrl.Result{}, err
		}
	}
	hash := specHash(p, cloudInit, credentialsFingerprint(login))
	current := p.GetAnnotations()[v1alpha1.AnnotationSpecHash]

	switch {
	case p.Status.ProviderID == "":
		return r.createInstance(ctx, p, prov, cloudInit, login, hash)
	case current == "":
		// An instance we did not record a hash for (status restored, or an
		// older controller): adopt it as it is rather than replace it.
		loggerFor(ctx, p).Info("adopting instance", "specHash", hash)
		if err := r.patchMeta(ctx, p, func(p *v1alpha1.Proxy) { setSpecHash(p, hash) }); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}, nil
	case current != hash:
		return r.replaceInstance(ctx, p, prov)
	default:
		return r.observeInstance(ctx, p, prov)
	}
}

// lookupProvider finds spec.provider among the configured providers, or fails
// the Proxy with a condition saying what is missing. It is not latched: the
// check costs no provider call, and a controller restarted with the provider
// configured must pick the Proxy up without a spec edit.
func (r *ProxyReconciler) lookupProvider(p *v1alpha1.Proxy) (providers.Provider, bool) {
	if r.Providers == nil {
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured,
			"no providers config was given to the controller (--providers-config), so Managed Proxies cannot be served; only External Proxies work")
		return nil, false
	}
	prov, ok := r.Providers[p.Spec.Provider]
	if !ok {
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured,
			fmt.Sprintf("provider %q is not configured in the controller's providers config", p.Spec.Provider))
		return nil, false
	}
	return prov, true
}

// createInstance asks the provider for a new instance under the name derived
// from the Proxy UID, so a retried or replacing Create always names the same
// instance. The finalizer and the spec-hash annotation are written first, in
// one metadata patch in a pass of its own: the instance is then created by a
// pass that has seen both, and the only write after Create is the status
// carrying the providerID. (Writing the annotation after Create would
// trigger a pass that reads the annotation but not yet the providerID from
// the cache, and creates again.)
func (r *ProxyReconciler) createInstance(ctx context.Context, p *v1alpha1.Proxy, prov providers.Provider, cloudInit []byte, login *providers.BasicAuth, hash string) (ctrl.Result, error) {
	if p.GetAnnotations()[v1alpha1.AnnotationSpecHash] != hash || !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		return ctrl.Result{}, r.patchMeta(ctx, p, func(p *v1alpha1.Proxy) {
			controllerutil.AddFinalizer(p, v1alpha1.Finalizer)
			setSpecHash(p, hash)
		})
	}
	// The providerID of the instance about to exist is the one fact a later
	// pass cannot look up again, and its status write is refused if this
	// pass read an outdated object (patchStatusIfChanged). So the read is
	// confirmed with the API server first: when the cache lags, this pass
	// creates nothing and the next one, from the newer object, does.
	if current, err := r.readIsCurrent(ctx, p); err != nil || !current {
		return ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}, err
	}
	req := createRequest(p, cloudInit, login)
	req.Installation = r.Installation
	inst, err := prov.Create(ctx, req)
	if err != nil {
		return r.providerFailure(ctx, p, "create", err)
	}
	loggerFor(ctx, p).Info("instance created", "instance", inst.Name, "newProviderID", inst.ProviderID)
	p.Status.ProviderID = inst.ProviderID
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance "+inst.Name+" created, waiting for it to run")
	return ctrl.Result{RequeueAfter: r.Intervals.ProvisioningPoll}, nil
}

// readIsCurrent reports whether p is the Proxy as the API server stores it
// now, by resourceVersion (one uncached GET). A reconciler built without a
// manager reads the API server directly and asks its client.
func (r *ProxyReconciler) readIsCurrent(ctx context.Context, p *v1alpha1.Proxy) (bool, error) {
	reader := r.apiReader
	if reader == nil {
		reader = r.Client
	}
	var live v1alpha1.Proxy
	err := reader.Get(ctx, client.ObjectKeyFromObject(p), &live)
	if isNotFound(err) {
		return false, nil // deleted meanwhile: its next pass is the delete
	}
	if err != nil {
		return false, fmt.Errorf("confirming the Proxy before creating its instance: %w", err)
	}
	return live.ResourceVersion == p.ResourceVersion, nil
}

// createRequest maps a Proxy onto the provider's request; the name derives
// from the UID alone, so every Create of the Proxy, and the delete of what
// one may have left, name the same instance.
func createRequest(p *v1alpha1.Proxy, cloudInit []byte, login *providers.BasicAuth) providers.CreateRequest {
	req := providers.CreateRequest{
		Name:           providers.NameFromUID(string(p.UID)),
		OwnerUID:       string(p.UID),
		OwnerName:      p.Name,
		OwnerNamespace: p.Namespace,
		Port:           int(p.EffectivePort()),
		CloudInit:      cloudInit,
		ProxyAuth:      login,
	}
	if pl := p.Spec.Placement; pl != nil {
		req.Placement = providers.Placement{Zone: pl.Zone, MachineType: pl.MachineType, Image: pl.Image}
	}
	return req
}

// replaceInstance retires an instance built from an older spec or cloud-init.
// It deletes and polls until the provider reports NotFound before the next
// pass recreates: the replacement has the same name, so creating early would
// collide with the instance still going away.
func (r *ProxyReconciler) replaceInstance(ctx context.Context, p *v1alpha1.Proxy, prov providers.Provider) (ctrl.Result, error) {
	_, err := prov.Get(ctx, p.Status.ProviderID)
	if providers.Class(err) == providers.ErrNotFound {
		// Gone: the next pass records the new hash and creates the
		// replacement under the same name.
		clearInstance(p)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonReplacing, "the old instance is gone; creating its replacement")
		return ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}, nil
	}
	if err != nil {
		return r.providerFailure(ctx, p, "get", err)
	}
	if err := prov.Delete(ctx, p.Status.ProviderID); err != nil {
		return r.providerFailure(ctx, p, "delete", err)
	}
	loggerFor(ctx, p).Info("replacing instance: spec or cloud-init changed")
	p.Status.IP = ""
	clearHealth(p)
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonReplacing, "spec or cloud-init changed; deleting the instance to recreate it")
	return ctrl.Result{RequeueAfter: r.Intervals.DeletionPoll}, nil
}

// observeInstance polls the provider for an instance built from the current
// spec and acts on its state. The reconciler never watches provider-side
// resources; this poll is how every state change is seen.
func (r *ProxyReconciler) observeInstance(ctx context.Context, p *v1alpha1.Proxy, prov providers.Provider) (ctrl.Result, error) {
	inst, err := prov.Get(ctx, p.Status.ProviderID)
	if providers.Class(err) == providers.ErrNotFound && neverRan(p) {
		wait := r.createRetryAfter(p)
		loggerFor(ctx, p).Info("instance vanished before it ran; creating it again after a wait", "wait", wait)
		clearInstance(p)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonCreateFailed,
			fmt.Sprintf("the provider accepted the create and the instance vanished before it ran (a gcp zone out of capacity does this; the provider's own log or console says why); creating it again in %s", wait))
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	if providers.Class(err) == providers.ErrNotFound {
		loggerFor(ctx, p).Info("instance gone; recreating")
		clearInstance(p)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonRecreating, "the instance is gone; creating it again")
		return ctrl.Result{RequeueAfter: r.Intervals.RequeueNow}, nil
	}
	if err != nil {
		return r.providerFailure(ctx, p, "get", err)
	}
	switch inst.State {
	case providers.StateRunning:
		if inst.IP == "" {
			setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance running, waiting for its address")
			return ctrl.Result{RequeueAfter: r.Intervals.ProvisioningPoll}, nil
		}
		if p.Status.IP != inst.IP {
			clearHealth(p)
			p.Status.IP = inst.IP
		}
		setProvisioned(p, metav1.ConditionTrue, v1alpha1.ReasonCreated, "instance running at "+inst.IP)
		r.applyHealth(p)
		return ctrl.Result{RequeueAfter: r.Intervals.DriftPoll}, nil
	case providers.StateStopped, providers.StateTerminated:
		// Cattle: a stopped instance is not restarted but replaced.
		if err := prov.Delete(ctx, p.Status.ProviderID); err != nil {
			return r.providerFailure(ctx, p, "delete", err)
		}
		loggerFor(ctx, p).Info("instance stopped; deleting to recreate", "state", inst.State)
		p.Status.IP = ""
		clearHealth(p)
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonRecreating,
			fmt.Sprintf("instance %s; deleting it to create it again", inst.State))
		return ctrl.Result{RequeueAfter: r.Intervals.DeletionPoll}, nil
	default:
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance is provisioning")
		return ctrl.Result{RequeueAfter: r.Intervals.ProvisioningPoll}, nil
	}
}

// neverRan reports a Proxy whose current instance was created and has not
// run yet (not one the reconciler itself deleted, which is Recreating or
// Replacing): its NotFound is a create the provider dropped.
func neverRan(p *v1alpha1.Proxy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonProvisioning
}

// createRetryAfter is how long a Proxy whose instance vanished before it
// ran waits before the next create: as long as it has been failing (since
// Provisioned last turned False), from RequeueNow up to QuotaRetry. The
// wait doubles with every failed create without a counter to store, and an
// accepted-then-dropped insert is not repeated every few seconds for as long
// as a zone stays out of capacity.
func (r *ProxyReconciler) createRetryAfter(p *v1alpha1.Proxy) time.Duration {
	wait := r.Intervals.RequeueNow
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		wait = max(wait, time.Since(c.LastTransitionTime.Time).Round(time.Second))
	}
	return min(wait, r.Intervals.QuotaRetry)
}

// providerFailure turns a provider error on the live path into the Proxy's
// next step by its class:
//
//	QuotaExceeded → condition (unless Provisioned), wait QuotaRetry, nil error (no error log, never Failed)
//	Permanent     → PermanentError latch for this generation → phase Failed
//	anything else → returned, so the workqueue retries with backoff
func (r *ProxyReconciler) providerFailure(ctx context.Context, p *v1alpha1.Proxy, op string, err error) (ctrl.Result, error) {
	msg := fmt.Sprintf("provider %s: %s failed: %v", p.Spec.Provider, op, err)
	switch providers.Class(err) {
	case providers.ErrQuotaExceeded:
		loggerFor(ctx, p).Info("provider quota exhausted; waiting", "op", op, "retryAfter", r.Intervals.QuotaRetry, "reason", err.Error())
		// A rate-limited look at a running instance says nothing about it,
		// as for a transient error below.
		if !meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned) {
			setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, msg)
		}
		return ctrl.Result{RequeueAfter: r.Intervals.QuotaRetry}, nil
	case providers.ErrPermanent:
		loggerFor(ctx, p).Info("provider failed permanently; waiting for a spec edit", "op", op, "reason", err.Error())
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonPermanentError, msg)
		return ctrl.Result{}, nil
	default:
		// Keep a working Proxy's condition: a blip in observing it says
		// nothing about the instance. Otherwise say why nothing progresses.
		if !meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned) {
			setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonTransientError, msg+" (retrying)")
		}
		return ctrl.Result{}, fmt.Errorf("provider %s %s: %w", p.Spec.Provider, op, err)
	}
}
