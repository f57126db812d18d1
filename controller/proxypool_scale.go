package controller

import (
	"context"
	"fmt"
	"maps"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// autoscale sizes a pool with spec.autoscaling from the lease store and
// writes the size through the scale subresource, as an HPA does; the
// decision goes into AbleToScale and ScalingLimited.
func (r *ProxyPoolReconciler) autoscale(ctx context.Context, ps *poolPass) error {
	p := ps.pool
	ps.wake(ps.now.Add(r.Intervals.Autoscale))
	if r.Leases == nil {
		setPoolCondition(p, v1alpha1.ConditionAbleToScale, metav1.ConditionFalse, v1alpha1.ReasonNoLeaseStore,
			"the controller serves no lease API (--lease-api-listen 0), so there are no leases to scale on; spec.replicas is left as it is")
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionScalingLimited)
		return nil
	}
	mem := r.autoscaleTimes(p)
	in := ps.autoscaleInput(r.Leases, mem)
	d := decideAutoscale(in)
	if d.Replicas != in.Current {
		if err := r.writeScale(ctx, p, d.Replicas); err != nil {
			setPoolCondition(p, v1alpha1.ConditionAbleToScale, metav1.ConditionFalse, v1alpha1.ReasonFailedUpdateScale,
				fmt.Sprintf("wanted replicas %d but the scale update failed: %v", d.Replicas, err))
			return err
		}
		log.FromContext(ctx).Info("autoscaled pool", "from", in.Current, "to", d.Replicas, "why", d.Message)
		replicas := d.Replicas
		p.Spec.Replicas = &replicas
		now := metav1.NewTime(ps.now)
		p.Status.LastScaleTime = &now
		mem.lastScale = ps.now
	}
	mem.downSince = d.ScaleDownSince
	r.precise.Store(p.UID, mem)
	p.Status.ScaleDownSince = nil
	if !d.ScaleDownSince.IsZero() {
		t := metav1.NewTime(d.ScaleDownSince)
		p.Status.ScaleDownSince = &t
		ps.wake(d.ScaleDownSince.Add(in.ScaleDownDelay))
	}
	setPoolCondition(p, v1alpha1.ConditionAbleToScale, metav1.ConditionTrue, d.Reason, d.Message)
	limited := metav1.ConditionFalse
	if d.Limited {
		limited = metav1.ConditionTrue
	}
	setPoolCondition(p, v1alpha1.ConditionScalingLimited, limited, d.LimitReason, d.LimitMessage)
	return nil
}

// autoscaleInput gathers what decideAutoscale weighs for the pass's pool:
// its Proxies as read, the lease store's counts and last refusal, and the
// autoscaler's own times (mem, at full resolution where this process made
// them).
func (ps *poolPass) autoscaleInput(leases LeaseStats, mem autoscaleTimes) autoscaleInput {
	p := ps.pool
	a := p.Spec.Autoscaling
	in := autoscaleInput{
		Current: p.Replicas(), Min: a.Min(), Max: a.MaxReplicas, Target: a.Target(),
		ScaleDownDelay: a.ScaleDownDelay(), Now: ps.now,
	}
	names := map[string]bool{}
	for i := range ps.proxies {
		px := &ps.proxies[i]
		in.ActiveLeases += ps.leases[leaseMemberName(px)].ActiveLeases
		if !px.DeletionTimestamp.IsZero() || px.IsDraining() {
			// A request pinned to a Proxy on its way out is refused
			// because it is going: no new Proxy could serve it.
			continue
		}
		names[leaseMemberName(px)] = true
		if comingUp(px) {
			in.ComingUp++
		}
		if t := landedAt(px); t.After(in.LastLanded) {
			in.LastLanded = t
		}
	}
	// The pool's Proxies as the lease API offers them: the template's
	// attributes and the two it sets itself, so that a refusal of a
	// selector naming the pool (proxyfleet.io/pool=NAME), or one narrowed
	// to a namespace's share of the fleet (docs/tenancy.md), counts for
	// this pool, and one narrowed to another namespace does not.
	attrs := maps.Clone(p.Spec.Template.Spec.Attributes)
	if attrs == nil {
		attrs = map[string]string{}
	}
	attrs[v1alpha1.AttributeNamespace], attrs[v1alpha1.LabelPool] = p.Namespace, p.Name
	in.LastRefusal = leases.LastRefusal(func(sel map[string]string, proxy string) bool {
		if proxy != "" {
			return names[proxy]
		}
		for k, v := range sel {
			if got, ok := attrs[k]; !ok || got != v {
				return false
			}
		}
		return true
	})
	in.LastScaleTime = preciseTime(p.Status.LastScaleTime, mem.lastScale)
	in.ScaleDownSince = preciseTime(p.Status.ScaleDownSince, mem.downSince)
	return in
}

// autoscaleTimes are the autoscaler's own times for one pool at full
// resolution: status holds them as metav1.Time, to the second, which would
// let a refusal from just before a step count again after it, or end a
// scale-down delay up to a second early.
type autoscaleTimes struct {
	lastScale, downSince time.Time
}

// autoscaleTimes returns what this process remembers for the pool.
func (r *ProxyPoolReconciler) autoscaleTimes(p *v1alpha1.ProxyPool) autoscaleTimes {
	if v, ok := r.precise.Load(p.UID); ok {
		return v.(autoscaleTimes)
	}
	return autoscaleTimes{}
}

// preciseTime is the remembered time when it is the one status holds, else
// status's (after a restart) moved a second later, so it is never earlier
// than the real one: a refusal or a delay is then judged conservatively.
func preciseTime(status *metav1.Time, remembered time.Time) time.Time {
	switch {
	case status == nil:
		return time.Time{}
	case !remembered.IsZero() && remembered.Truncate(time.Second).Equal(status.Truncate(time.Second)):
		return remembered
	}
	return status.Add(time.Second)
}

// landedAt is when a Proxy turned Ready (Healthy true), judged
// conservatively: zero when it is not Ready. Its condition's transition time
// is kept to the second, truncated, so a Proxy that landed "at second S" is
// taken to have landed at the end of S: no refusal from within S counts as
// made after it, and a refusal in the second before a landing can no longer
// step the pool up a second time for a step that has landed. What this gives
// up: a refusal genuinely made after the landing within the same second does
// not count; the pool steps up on the next refusal instead, at most a
// second later for a client that keeps asking.
func landedAt(px *v1alpha1.Proxy) time.Time {
	c := px.Condition(v1alpha1.ConditionHealthy)
	if c == nil || c.Status != metav1.ConditionTrue {
		return time.Time{}
	}
	return c.LastTransitionTime.Truncate(time.Second).Add(time.Second)
}

// writeScale sets spec.replicas through the scale subresource: read the
// Scale, change it, write it back with its resourceVersion, so a concurrent
// kubectl scale is a conflict rather than silently overwritten.
func (r *ProxyPoolReconciler) writeScale(ctx context.Context, p *v1alpha1.ProxyPool, replicas int32) error {
	var sc autoscalingv1.Scale
	if err := r.Client.SubResource("scale").Get(ctx, p, &sc); err != nil {
		return fmt.Errorf("reading /scale of pool %s: %w", p.Name, err)
	}
	if sc.Spec.Replicas != p.Replicas() {
		return fmt.Errorf("pool %s was scaled to %d meanwhile; deciding again", p.Name, sc.Spec.Replicas)
	}
	sc.Spec.Replicas = replicas
	if err := r.Client.SubResource("scale").Update(ctx, p, client.WithSubResourceBody(&sc)); err != nil {
		return fmt.Errorf("writing /scale of pool %s: %w", p.Name, err)
	}
	return nil
}

// setPoolCondition stages one condition for this generation.
func setPoolCondition(p *v1alpha1.ProxyPool, t string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: p.Generation,
	})
}
