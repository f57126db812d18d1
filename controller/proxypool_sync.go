package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// templateHash is the hex SHA-256 (first 16 characters: a valid label value)
// of the pool template as stored, defaults included. Every template change
// changes it, and a Proxy labelled with another hash is rolled.
func templateHash(t *v1alpha1.ProxyTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// Strings, ints and maps of strings always marshal.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// leaseMemberName is the lease store's name for a Proxy, as
// controller/leases.MemberName builds it (leases's tests import this
// package, so this package cannot import leases).
func leaseMemberName(p *v1alpha1.Proxy) string { return p.Namespace + "/" + p.Name }

// listProxies reads the pool's Proxies from the API server: those with the
// pool's label that the pool controls. A labelled Proxy another owner (or
// nobody) controls is left alone; the pool does not adopt.
func (r *ProxyPoolReconciler) listProxies(ctx context.Context, ps *poolPass) error {
	var list v1alpha1.ProxyList
	if err := r.Reader.List(ctx, &list, client.InNamespace(ps.pool.Namespace),
		client.MatchingLabels(ps.pool.SelectorLabels())); err != nil {
		return fmt.Errorf("listing the Proxies of pool %s: %w", ps.pool.Name, err)
	}
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], ps.pool) {
			ps.proxies = append(ps.proxies, list.Items[i])
		}
	}
	return nil
}

// updated reports whether a Proxy is of the current template and, with
// maxAge, young enough; for one that is, it asks for a pass when it ages out.
func (ps *poolPass) updated(px *v1alpha1.Proxy) bool {
	if px.Labels[v1alpha1.LabelPoolTemplateHash] != ps.hash {
		return false
	}
	if maxAge := ps.pool.MaxAge(); maxAge > 0 && !comingUp(px) {
		// A Proxy still coming up is not aged out: with a maxAge shorter
		// than its boot and first probe, every Proxy would be replaced
		// before it served, creating and deleting instances without end.
		// Its verdict's status write brings the pass that ages it out.
		expires := px.CreationTimestamp.Add(maxAge)
		if !ps.now.Before(expires) {
			return false
		}
		ps.wake(expires)
	}
	return true
}

// unhealthy reports a Proxy with a verdict against it: Healthy False, or a
// provider failure the controller latched.
func unhealthy(px *v1alpha1.Proxy) bool {
	c := px.Condition(v1alpha1.ConditionHealthy)
	return (c != nil && c.Status == metav1.ConditionFalse) || px.Status.Phase == v1alpha1.PhaseFailed
}

// comingUp reports a Proxy with no health verdict yet that has not failed.
func comingUp(px *v1alpha1.Proxy) bool {
	c := px.Condition(v1alpha1.ConditionHealthy)
	return (c == nil || c.Status == metav1.ConditionUnknown) && px.Status.Phase != v1alpha1.PhaseFailed
}

// members is the pool's Proxies in service or coming up, for planPool.
func (ps *poolPass) members() []poolMember {
	var out []poolMember
	for i := range ps.proxies {
		px := &ps.proxies[i]
		if !px.DeletionTimestamp.IsZero() || px.IsDraining() {
			continue
		}
		out = append(out, poolMember{
			Name:      px.Name,
			Created:   px.CreationTimestamp.Time,
			Ready:     px.IsHealthy(),
			Unhealthy: unhealthy(px),
			Updated:   ps.updated(px),
			Leases:    ps.leases[leaseMemberName(px)].ActiveLeases,
		})
	}
	return out
}

// applyPlan takes one planned step: drains first (so a failure to create
// never keeps an old Proxy in service longer than planned), then creates.
func (r *ProxyPoolReconciler) applyPlan(ctx context.Context, ps *poolPass) error {
	p := ps.pool
	members := r.recycle(ctx, ps, ps.heal(ps.members()))
	plan := planPool(int(p.Replicas()), int(p.MaxSurge()), int(p.MaxUnavailable()), members)
	for _, name := range plan.Drain {
		if err := r.startDrain(ctx, ps, name); err != nil {
			return err
		}
	}
	for range plan.Create {
		if err := r.createProxy(ctx, ps); err != nil {
			return err
		}
	}
	if ps.healed && ps.created > 0 {
		// The next round asks whether a Proxy made since this one became
		// Ready, reading the Proxies' creation times: the API server's
		// clock. The round's time is taken on the same clock, or a
		// controller clock ahead of it would make every replacement look
		// older than its round, and every round a failed one.
		p.Status.LastReplacementTime = &metav1.Time{Time: ps.firstCreated}
	}
	return nil
}

// stampDrain writes now into a draining Proxy's annotation that carried no
// time.
func (r *ProxyPoolReconciler) stampDrain(ctx context.Context, px *v1alpha1.Proxy, now time.Time) error {
	before := px.DeepCopy()
	px.Annotations[v1alpha1.AnnotationDraining] = now.UTC().Format(time.RFC3339Nano)
	return client.IgnoreNotFound(r.Client.Patch(ctx, px, client.MergeFrom(before)))
}

// startDrain annotates a Proxy proxyfleet.io/draining: the lease API stops
// offering it at once, its leases run on for up to drainSeconds.
func (r *ProxyPoolReconciler) startDrain(ctx context.Context, ps *poolPass, name string) error {
	for i := range ps.proxies {
		px := &ps.proxies[i]
		if px.Name != name {
			continue
		}
		before := px.DeepCopy()
		if px.Annotations == nil {
			px.Annotations = map[string]string{}
		}
		px.Annotations[v1alpha1.AnnotationDraining] = ps.now.UTC().Format(time.RFC3339Nano)
		note, recycling := ps.recycleNote(name)
		if recycling {
			px.Annotations[v1alpha1.AnnotationRecycled] = note
		}
		if err := r.Client.Patch(ctx, px, client.MergeFrom(before)); err != nil {
			return client.IgnoreNotFound(err)
		}
		if recycling {
			r.countRecycle(ps)
		}
		log.FromContext(ctx).Info("draining Proxy", "proxy", name, "activeLeases", ps.leases[leaseMemberName(px)].ActiveLeases,
			"drainTimeout", ps.pool.DrainTimeout(), "recycled", note)
		ps.drained[name] = true
		ps.wake(ps.now.Add(min(r.Intervals.DrainPoll, ps.pool.DrainTimeout())))
		return nil
	}
	return nil
}

// createProxy stamps a Proxy out of the template: named <pool>-<random>,
// labelled with the pool and the template hash, controlled by the pool.
func (r *ProxyPoolReconciler) createProxy(ctx context.Context, ps *poolPass) error {
	p := ps.pool
	labels := maps.Clone(p.Spec.Template.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, p.SelectorLabels())
	labels[v1alpha1.LabelPoolTemplateHash] = ps.hash
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{GenerateName: p.Name + "-", Namespace: p.Namespace, Labels: labels},
		Spec:       *p.Spec.Template.Spec.DeepCopy(),
	}
	if err := controllerutil.SetControllerReference(p, px, r.Client.Scheme()); err != nil {
		return fmt.Errorf("owner reference for a Proxy of pool %s: %w", p.Name, err)
	}
	if err := r.Client.Create(ctx, px); err != nil {
		// Staged for the Ready condition: otherwise only the log would
		// say why the pool never gets its Proxies.
		ps.createErr = err
		return fmt.Errorf("creating a Proxy for pool %s: %w", p.Name, err)
	}
	log.FromContext(ctx).Info("created Proxy", "proxy", px.Name, "templateHash", ps.hash)
	if ps.created == 0 {
		ps.firstCreated = px.CreationTimestamp.Time
	}
	ps.created++
	return nil
}

// finishDrains deletes each draining Proxy whose drain is done, and asks for
// a pass when the others should be looked at again.
func (r *ProxyPoolReconciler) finishDrains(ctx context.Context, ps *poolPass) error {
	timeout := ps.pool.DrainTimeout()
	for i := range ps.proxies {
		px := &ps.proxies[i]
		since, draining := px.DrainingSince()
		if !draining || !px.DeletionTimestamp.IsZero() {
			continue
		}
		if since.IsZero() {
			// Set by hand without a time: the drain starts now, not at
			// the zero time (which would delete it at once, cutting its
			// leases).
			if err := r.stampDrain(ctx, px, ps.now); err != nil {
				return err
			}
			ps.wake(ps.now.Add(r.Intervals.DrainPoll))
			continue
		}
		m, inStore := ps.leases[leaseMemberName(px)]
		if !drainDone(m.ActiveLeases, inStore && m.Healthy, since, timeout, ps.now) {
			ps.wake(minTime(ps.now.Add(r.Intervals.DrainPoll), since.Add(timeout)))
			continue
		}
		if err := r.deleteProxy(ctx, px); err != nil {
			return err
		}
		log.FromContext(ctx).Info("deleted drained Proxy", "proxy", px.Name, "activeLeases", m.ActiveLeases,
			"drainedFor", ps.now.Sub(since).Round(time.Millisecond))
	}
	return nil
}

// deleteProxy deletes one Proxy (its own finalizer then removes the
// instance), only if it is still the object the pass read.
func (r *ProxyPoolReconciler) deleteProxy(ctx context.Context, px *v1alpha1.Proxy) error {
	uid := px.UID
	if err := r.Client.Delete(ctx, px, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting Proxy %s: %w", px.Name, err)
	}
	px.DeletionTimestamp = &metav1.Time{Time: r.Clock.Now()}
	return nil
}

// reconcileDeletePool deletes the pool's Proxies and releases the pool once
// they are gone, so kubectl delete pxp returns when the instances are
// deleted too. The Kubernetes garbage collector would do the same from the
// owner references; doing it here does not depend on it, and honours
// `kubectl delete --cascade=orphan` (the orphan finalizer): the Proxies are
// then left.
func (r *ProxyPoolReconciler) reconcileDeletePool(ctx context.Context, ps *poolPass) error {
	p := ps.pool
	if !controllerutil.ContainsFinalizer(p, v1alpha1.PoolFinalizer) {
		return nil
	}
	setPoolReady(p, metav1.ConditionFalse, v1alpha1.ReasonDeletingPool,
		fmt.Sprintf("deleting the pool and its %d Proxies", len(ps.proxies)))
	if !controllerutil.ContainsFinalizer(p, metav1.FinalizerOrphanDependents) {
		for i := range ps.proxies {
			if ps.proxies[i].DeletionTimestamp.IsZero() {
				if err := r.deleteProxy(ctx, &ps.proxies[i]); err != nil {
					return err
				}
			}
		}
		if len(ps.proxies) > 0 {
			// The Proxies' deletion events bring the next pass; the poll is a backstop.
			ps.wake(ps.now.Add(r.Intervals.DrainPoll))
			return nil
		}
	}
	return client.IgnoreNotFound(r.patchPoolMeta(ctx, p, func(p *v1alpha1.ProxyPool) {
		controllerutil.RemoveFinalizer(p, v1alpha1.PoolFinalizer)
	}))
}

// setPoolReady stages the pool's Ready condition for this generation.
func setPoolReady(p *v1alpha1.ProxyPool, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: message, ObservedGeneration: p.Generation,
	})
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
