package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Replicas is spec.replicas, or DefaultPoolReplicas for a pool that did not
// pass through the API server's defaulting.
func (p *ProxyPool) Replicas() int32 { return deref(p.Spec.Replicas, DefaultPoolReplicas) }

// MaxSurge is spec.maxSurge, defaulted.
func (p *ProxyPool) MaxSurge() int32 { return deref(p.Spec.MaxSurge, DefaultPoolMaxSurge) }

// MaxUnavailable is spec.maxUnavailable, defaulted.
func (p *ProxyPool) MaxUnavailable() int32 {
	return deref(p.Spec.MaxUnavailable, DefaultPoolMaxUnavailable)
}

// DrainTimeout is spec.drainSeconds as a duration, defaulted.
func (p *ProxyPool) DrainTimeout() time.Duration {
	return time.Duration(deref(p.Spec.DrainSeconds, DefaultPoolDrainSeconds)) * time.Second
}

// MaxAge is spec.maxAge, 0 when unset (Proxies are kept however old).
func (p *ProxyPool) MaxAge() time.Duration {
	if p.Spec.MaxAge == nil {
		return 0
	}
	return p.Spec.MaxAge.Duration
}

// ReplaceUnhealthyAfter is spec.replaceUnhealthyAfter, defaulted; 0 means
// unhealthy Proxies are never replaced.
func (p *ProxyPool) ReplaceUnhealthyAfter() time.Duration {
	if p.Spec.ReplaceUnhealthyAfter == nil {
		return DefaultReplaceUnhealthyAfter
	}
	return max(p.Spec.ReplaceUnhealthyAfter.Duration, 0)
}

// RecycleWindow is spec.recycle.window, defaulted; 0 when spec.recycle is
// unset.
func (p *ProxyPool) RecycleWindow() time.Duration {
	switch r := p.Spec.Recycle; {
	case r == nil:
		return 0
	case r.Window == nil:
		return DefaultRecycleWindow
	default:
		return max(r.Window.Duration, 0)
	}
}

// SelectorLabels are the labels every Proxy of the pool carries and the
// pool selects them by.
func (p *ProxyPool) SelectorLabels() labels.Set {
	return labels.Set{LabelPool: p.Name}
}

// Selector is SelectorLabels serialized, as status.selector holds it.
func (p *ProxyPool) Selector() string { return p.SelectorLabels().String() }

// Min is minReplicas, defaulted.
func (a *PoolAutoscaling) Min() int32 { return deref(a.MinReplicas, DefaultAutoscalingMinReplicas) }

// Target is targetLeasesPerProxy, defaulted (and never below 1, so it can
// divide).
func (a *PoolAutoscaling) Target() int32 {
	if a.TargetLeasesPerProxy < 1 {
		return DefaultTargetLeasesPerProxy
	}
	return a.TargetLeasesPerProxy
}

// ScaleDownDelay is scaleDownDelaySeconds as a duration, defaulted.
func (a *PoolAutoscaling) ScaleDownDelay() time.Duration {
	return time.Duration(deref(a.ScaleDownDelaySeconds, DefaultScaleDownDelaySeconds)) * time.Second
}

// DrainingSince reports whether the proxyfleet.io/draining annotation is set
// and since when. A value that is no RFC 3339 time (a hand-set "true")
// still drains (the lease API honours the annotation's presence) and gives
// the zero time: a pool stamps it with the time it first saw it, so its
// leases get their drainSeconds as with a drain the pool began.
func (p *Proxy) DrainingSince() (time.Time, bool) {
	v, ok := p.Annotations[AnnotationDraining]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, true
	}
	return t, true
}

// IsDraining reports whether the Proxy is out of the lease API because the
// proxyfleet.io/draining annotation is set.
func (p *Proxy) IsDraining() bool {
	_, ok := p.Annotations[AnnotationDraining]
	return ok
}

func deref(v *int32, def int32) int32 {
	if v == nil {
		return def
	}
	return *v
}

// Condition returns the pool's condition of type t, nil when it has none.
func (p *ProxyPool) Condition(t string) *metav1.Condition {
	return meta.FindStatusCondition(p.Status.Conditions, t)
}
