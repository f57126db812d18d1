package controller

import (
	"context"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
)

// reconcileExternal represents a proxy someone else runs: its address comes
// from spec.endpoint and no provider is ever called, so no finalizer is
// needed either. Health is represented as for Managed Proxies. A login named
// by spec.endpoint.credentialsSecretRef that cannot be read (missing,
// unlabelled, a key empty) is Provisioned=False/CredentialsError with the
// reason: the credentials Secret watch brings the next pass once it is fixed.
func (r *ProxyReconciler) reconcileExternal(ctx context.Context, p *v1alpha1.Proxy) (ctrl.Result, error) {
	host := p.EffectiveHost()
	if p.Status.IP != host {
		clearHealth(p)
		p.Status.IP = host
	}
	if _, err := credentials.Login(ctx, r.Credentials, p); err != nil {
		setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonCredentialsError, err.Error())
		r.applyHealth(p)
		return ctrl.Result{}, nil
	}
	msg := "external proxy at " + p.EffectiveScheme() + "://" + p.Address()
	if name := p.CredentialsSecretName(); name != "" {
		msg += ", login from Secret " + name
	}
	setProvisioned(p, metav1.ConditionTrue, v1alpha1.ReasonExternalEndpoint, msg)
	r.applyHealth(p)
	return ctrl.Result{}, nil
}
