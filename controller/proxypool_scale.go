package controller

import (
	"context"
	"fmt"
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
	a := p.Spec.Autoscaling
	ps.wake(ps.now.Add(r.Intervals.Autoscale))
	if r.Leases == nil {
		setPoolCondition(p, v1alpha1.ConditionAbleToScale, metav1.ConditionFalse, v1alpha1.ReasonNoLeaseStore,
			"the controller serves no lease API (--lease-api-listen 0), so there are no leases to scale on; spec.replicas is left as it is")
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionScalingLimited)
		return nil
	}
	names := map[string]bool{}
	in := autoscaleInput{
		Current: p.Replicas(), Min: a.Min(), Max: a.MaxReplicas, Target: a.Target(),
		ScaleDownDelay: a.ScaleDownDelay(), Now: ps.now,
	}
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
		// The transition time is to the second, truncated: a refusal in
		// the second a Proxy landed, just before it, may still count.
		if c := px.Condition(v1alpha1.ConditionHealthy); c != nil && c.Status == metav1.ConditionTrue && c.LastTransitionTime.After(in.LastLanded) {
			in.LastLanded = c.LastTransitionTime.Time
		}
	}
	attrs := p.Spec.Template.Spec.Attributes
	in.LastRefusal = r.Leases.LastRefusal(func(sel map[string]string, proxy string) bool {
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
	mem := r.autoscaleTimes(p)
	in.LastScaleTime = preciseTime(p.Status.LastScaleTime, mem.lastScale)
	in.ScaleDownSince = preciseTime(p.Status.ScaleDownSince, mem.downSince)

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
