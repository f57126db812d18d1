package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/pool"
)

// LeaseStats is the controller's lease store as the ProxyPool reconciler
// reads it. The lease API (controller/leases.API) implements it; nil means
// the controller serves no lease API: Proxies then hold no leases as far as
// a pool can tell, and autoscaling says it has nothing to scale on.
type LeaseStats interface {
	// Members lists the store's members ("<namespace>/<name>") with their
	// active leases and whether they are offered (Healthy).
	Members() []pool.MemberStatus
	// LastRefusal is when a lease request for which match holds was last
	// refused with 409 in the last minute; the zero time if none.
	LastRefusal(match func(selector map[string]string, proxy string) bool) time.Time
}

// PoolIntervals are the ProxyPool reconciler's periods; each is a flag so
// tests can shrink them.
type PoolIntervals struct {
	// DrainPoll is how often a pool with draining Proxies checks whether
	// their leases have ended (lease changes make no Kubernetes events).
	DrainPoll time.Duration
	// Autoscale is how often a pool with spec.autoscaling recomputes its
	// size (the HPA's sync period is 15s).
	Autoscale time.Duration
	// Recycle is how often a pool with spec.recycle reads the bans from the
	// lease store (bans make no Kubernetes events); SetupWithManager takes
	// DefaultRecycleInterval for zero.
	Recycle time.Duration
}

// DefaultRecycleInterval is how often a pool with spec.recycle reads the
// bans: a ban lasts minutes (the default cooldown is 10m), so a burnt Proxy
// waits at most this long to be picked, at one store read per pool.
const DefaultRecycleInterval = 30 * time.Second

// DefaultPoolIntervals returns the production periods.
func DefaultPoolIntervals() PoolIntervals {
	return PoolIntervals{DrainPoll: 5 * time.Second, Autoscale: 15 * time.Second, Recycle: DefaultRecycleInterval}
}

// Validate names the first period that is not positive by its flag.
func (iv PoolIntervals) Validate() error {
	if iv.DrainPoll <= 0 {
		return fmt.Errorf("--pool-drain-poll must be a positive duration, got %s", iv.DrainPoll)
	}
	if iv.Autoscale <= 0 {
		return fmt.Errorf("--autoscale-interval must be a positive duration, got %s", iv.Autoscale)
	}
	if iv.Recycle <= 0 {
		return fmt.Errorf("--recycle-interval must be a positive duration, got %s", iv.Recycle)
	}
	return nil
}

// ProxyPoolReconciler keeps each ProxyPool's Proxies: creates them from the
// template, drains and deletes the ones it removes, rolls them on a template
// change or past maxAge, sizes the pool from the lease store when
// spec.autoscaling is set, and deletes the Proxies with the pool. It is the
// only writer of ProxyPool status; spec.replicas it writes only through the
// scale subresource, as an HPA would.
type ProxyPoolReconciler struct {
	// Client writes to the API server (creates, patches, deletes, /scale).
	Client client.Client
	// Reader reads pools and their Proxies from the API server directly,
	// not the cache: a pass must see the Proxies the previous pass created
	// or a stale cache would make it create them again.
	Reader client.Reader
	// Leases is the lease store; nil when the controller serves no lease API.
	Leases LeaseStats
	// Bans is the lease store's record of bans, for spec.recycle; nil when
	// the controller serves no lease API (pools then recycle nothing and
	// say so).
	Bans BanSource
	// Recycles, when set, counts the Proxies recycled.
	Recycles RecycleRecorder
	// Intervals are the reconciler's periods.
	Intervals PoolIntervals
	// Clock is the time source of rollouts, drains and autoscaling; nil
	// means the real clock.
	Clock clock.PassiveClock
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool

	// precise maps a pool's UID to its autoscaleTimes.
	precise sync.Map
}

// SetupWithManager registers the reconciler: pools, and every change of a
// Proxy a pool controls (status included: readiness drives rollouts).
func (r *ProxyPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	if r.Intervals == (PoolIntervals{}) {
		r.Intervals = DefaultPoolIntervals()
	}
	if r.Intervals.Recycle == 0 {
		r.Intervals.Recycle = DefaultRecycleInterval
	}
	if err := r.Intervals.Validate(); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	opts := controller.Options{MaxConcurrentReconciles: 1}
	if r.SkipNameValidation {
		skip := true
		opts.SkipNameValidation = &skip
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool").
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(ignoreStatusOnlyUpdates())).
		Owns(&v1alpha1.Proxy{}).
		WithOptions(opts).
		Complete(r)
}

// poolPass is one reconcile of one pool: what it read and what it decided,
// for the status written at the end.
type poolPass struct {
	pool    *v1alpha1.ProxyPool
	now     time.Time
	proxies []v1alpha1.Proxy // controlled by the pool, as read at the start
	leases  map[string]pool.MemberStatus
	hash    string
	// created and drained are this pass's actions, counted into status.
	created int
	drained map[string]bool
	// firstCreated is the API server's creation time of the first Proxy
	// this pass created; healed says the pass began a round of replacing
	// unhealthy Proxies.
	firstCreated time.Time
	healed       bool
	// createErr is the API server's refusal of a Proxy this pass tried to
	// create, for the Ready condition; nil when none was refused.
	createErr error
	// recycling maps the members this pass recycles to the sites that
	// banned them.
	recycling map[string][]string
	// requeue is the earliest time the pass wants to run again; zero: none.
	requeue time.Time
}

// wake asks for another pass at t at the latest.
func (ps *poolPass) wake(t time.Time) {
	if ps.requeue.IsZero() || t.Before(ps.requeue) {
		ps.requeue = t
	}
}

// Reconcile reads the pool and its Proxies, autoscales, finishes drains,
// applies one planned step, and writes status once at the end.
func (r *ProxyPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	var p v1alpha1.ProxyPool
	if err := r.Reader.Get(ctx, req.NamespacedName, &p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := p.DeepCopy()
	ps := &poolPass{pool: &p, now: r.Clock.Now(), drained: map[string]bool{}, hash: templateHash(&p.Spec.Template)}
	defer func() {
		if serr := r.patchStatusIfChanged(ctx, base, ps); serr != nil {
			err = errors.Join(err, serr)
		}
		if err == nil && !ps.requeue.IsZero() {
			res.RequeueAfter = max(ps.requeue.Sub(r.Clock.Now()), time.Millisecond)
		}
	}()
	if err := r.listProxies(ctx, ps); err != nil {
		return ctrl.Result{}, err
	}
	if !p.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDeletePool(ctx, ps)
	}
	if !controllerutil.ContainsFinalizer(&p, v1alpha1.PoolFinalizer) {
		if err := r.patchPoolMeta(ctx, &p, func(p *v1alpha1.ProxyPool) {
			controllerutil.AddFinalizer(p, v1alpha1.PoolFinalizer)
		}); err != nil {
			return ctrl.Result{}, err
		}
	}
	ps.leases = r.memberLeases()
	if p.Spec.Autoscaling != nil {
		if err := r.autoscale(ctx, ps); err != nil {
			return ctrl.Result{}, err
		}
	} else {
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionAbleToScale)
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionScalingLimited)
		p.Status.ScaleDownSince = nil
	}
	if err := r.finishDrains(ctx, ps); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.applyPlan(ctx, ps)
}

// memberLeases indexes the lease store's members by name; empty without a
// lease store.
func (r *ProxyPoolReconciler) memberLeases() map[string]pool.MemberStatus {
	out := map[string]pool.MemberStatus{}
	if r.Leases == nil {
		return out
	}
	for _, m := range r.Leases.Members() {
		out[m.Name] = m
	}
	return out
}

// patchPoolMeta writes metadata changes (the finalizer) as a merge patch,
// keeping the status staged so far.
func (r *ProxyPoolReconciler) patchPoolMeta(ctx context.Context, p *v1alpha1.ProxyPool, mutate func(*v1alpha1.ProxyPool)) error {
	staged := p.Status.DeepCopy()
	before := p.DeepCopy()
	mutate(p)
	err := r.Client.Patch(ctx, p, client.MergeFrom(before))
	p.Status = *staged
	return err
}
