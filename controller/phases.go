package controller

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// computePhase derives the phase from the conditions, so it can never
// disagree with them:
//
//	deletion requested                          → Deleting
//	Provisioned=False, PermanentError or ProviderNotConfigured → Failed
//	Provisioned=True, Healthy=True               → Ready
//	Provisioned=True, Healthy=False              → Unhealthy
//	Provisioned=True, no health verdict yet      → Provisioning
//	Provisioned=False, Provisioning, Replacing or Recreating → Provisioning
//	anything else (new, quota wait, cloud-init)  → Pending
func computePhase(p *v1alpha1.Proxy) v1alpha1.ProxyPhase {
	if !p.DeletionTimestamp.IsZero() {
		return v1alpha1.PhaseDeleting
	}
	prov := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	if prov == nil {
		return v1alpha1.PhasePending
	}
	switch prov.Status {
	case metav1.ConditionTrue:
		healthy := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
		switch {
		case healthy == nil || healthy.Status == metav1.ConditionUnknown:
			return v1alpha1.PhaseProvisioning
		case healthy.Status == metav1.ConditionTrue:
			return v1alpha1.PhaseReady
		default:
			return v1alpha1.PhaseUnhealthy
		}
	case metav1.ConditionFalse:
		switch prov.Reason {
		case v1alpha1.ReasonPermanentError, v1alpha1.ReasonProviderNotConfigured:
			return v1alpha1.PhaseFailed
		case v1alpha1.ReasonProvisioning, v1alpha1.ReasonReplacing, v1alpha1.ReasonRecreating:
			return v1alpha1.PhaseProvisioning
		}
	}
	return v1alpha1.PhasePending
}
