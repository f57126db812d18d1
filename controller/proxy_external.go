package controller

import (
	"context"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// reconcileExternal represents a proxy someone else runs: its address comes
// from spec.endpoint and no provider is ever called, so no finalizer is
// needed either. Health is represented as for Managed Proxies.
func (r *ProxyReconciler) reconcileExternal(_ context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	host := p.EffectiveHost()
	if p.Status.IP != host {
		clearHealth(p)
		p.Status.IP = host
	}
	setProvisioned(p, metav1.ConditionTrue, v1alpha1.ReasonExternalEndpoint, "external proxy at "+p.Address())
	r.applyHealth(p)
	return ctrl.Result{}, nil
}
