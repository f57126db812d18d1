package controller

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// poolCounts are the pool's Proxies counted for status, after this pass's
// actions.
type poolCounts struct {
	replicas, ready, updated, draining, comingUp int
}

// count tallies the pool's Proxies: those drained this pass as draining,
// those created this pass as updated and coming up.
func (ps *poolPass) count() poolCounts {
	var c poolCounts
	for i := range ps.proxies {
		px := &ps.proxies[i]
		switch {
		case !px.DeletionTimestamp.IsZero():
			continue
		case px.IsDraining() || ps.drained[px.Name]:
			c.draining++
			continue
		}
		c.replicas++
		if px.IsHealthy() {
			c.ready++
		}
		if px.Labels[v1alpha1.LabelPoolTemplateHash] == ps.hash &&
			(ps.pool.MaxAge() == 0 || ps.now.Before(px.CreationTimestamp.Add(ps.pool.MaxAge()))) {
			c.updated++
		}
		if comingUp(px) {
			c.comingUp++
		}
	}
	c.replicas += ps.created
	c.updated += ps.created
	c.comingUp += ps.created
	return c
}

// stageStatus fills in the counts, the selector and the Ready condition.
func (ps *poolPass) stageStatus() {
	p := ps.pool
	st := &p.Status
	st.ObservedGeneration = p.Generation
	st.Selector = p.Selector()
	st.DesiredReplicas = p.Replicas()
	if !p.DeletionTimestamp.IsZero() {
		st.Replicas, st.ReadyReplicas, st.UpdatedReplicas, st.DrainingReplicas = 0, 0, 0, int32(len(ps.proxies))
		return
	}
	c := ps.count()
	st.Replicas, st.ReadyReplicas = int32(c.replicas), int32(c.ready)
	st.UpdatedReplicas, st.DrainingReplicas = int32(c.updated), int32(c.draining)

	want := int(p.Replicas())
	var parts []string
	parts = append(parts, fmt.Sprintf("%d of %d Proxies Ready", c.ready, want))
	if c.comingUp > 0 {
		parts = append(parts, fmt.Sprintf("%d coming up", c.comingUp))
	}
	if old := c.replicas - c.updated; old > 0 {
		parts = append(parts, fmt.Sprintf("%d to replace (template changed or past maxAge)", old))
	}
	if c.draining > 0 {
		parts = append(parts, fmt.Sprintf("%d draining", c.draining))
	}
	if ps.createErr != nil {
		parts = append(parts, "creating a Proxy failed: "+ps.createErr.Error())
	}
	msg := strings.Join(parts, "; ")
	status := metav1.ConditionFalse
	if c.ready >= want {
		status = metav1.ConditionTrue
	}
	reason := v1alpha1.ReasonAllReady
	switch {
	case ps.createErr != nil:
		reason = v1alpha1.ReasonFailedCreate
	case c.replicas-c.updated > 0:
		reason = v1alpha1.ReasonRollingOut
	case c.replicas != want || c.draining > 0:
		reason = v1alpha1.ReasonScaling
	case c.ready < want:
		reason = v1alpha1.ReasonNotReady
	}
	setPoolReady(p, status, reason, msg)
}

// patchStatusIfChanged is the one place ProxyPool status is written: only
// when it differs from what the pass read.
func (r *ProxyPoolReconciler) patchStatusIfChanged(ctx context.Context, base *v1alpha1.ProxyPool, ps *poolPass) error {
	p := ps.pool
	if !p.DeletionTimestamp.IsZero() && len(p.Finalizers) == 0 {
		return nil // gone with its last finalizer
	}
	ps.stageStatus()
	if equality.Semantic.DeepEqual(base.Status, p.Status) {
		return nil
	}
	from := p.DeepCopy()
	from.Status = base.Status
	if err := r.Client.Status().Patch(ctx, p, client.MergeFrom(from)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}
