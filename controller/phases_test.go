package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestComputePhaseFollowsTheConditions(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason}
	}
	prov := func(s metav1.ConditionStatus, reason string) metav1.Condition {
		return cond(v1alpha1.ConditionProvisioned, s, reason)
	}
	healthy := func(s metav1.ConditionStatus) metav1.Condition {
		return cond(v1alpha1.ConditionHealthy, s, v1alpha1.ReasonProbeSucceeded)
	}
	now := metav1.Now()
	tests := []struct {
		name     string
		conds    []metav1.Condition
		deleting bool
		want     v1alpha1.ProxyPhase
	}{
		{name: "new object is Pending", want: v1alpha1.PhasePending},
		{name: "creating is Provisioning", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning)}, want: v1alpha1.PhaseProvisioning},
		{name: "replacing is Provisioning", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonReplacing)}, want: v1alpha1.PhaseProvisioning},
		{name: "recreating is Provisioning", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonRecreating)}, want: v1alpha1.PhaseProvisioning},
		{name: "provisioned without a verdict is still Provisioning", conds: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonCreated)}, want: v1alpha1.PhaseProvisioning},
		{name: "provisioned and healthy is Ready", conds: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonCreated), healthy(metav1.ConditionTrue)}, want: v1alpha1.PhaseReady},
		{name: "external and healthy is Ready", conds: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonExternalEndpoint), healthy(metav1.ConditionTrue)}, want: v1alpha1.PhaseReady},
		{name: "provisioned and unhealthy is Unhealthy", conds: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonCreated), healthy(metav1.ConditionFalse)}, want: v1alpha1.PhaseUnhealthy},
		{name: "permanent error is Failed", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError)}, want: v1alpha1.PhaseFailed},
		{name: "unknown provider is Failed", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured)}, want: v1alpha1.PhaseFailed},
		{name: "quota wait is Pending, never Failed", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)}, want: v1alpha1.PhasePending},
		{name: "cloud-init error is Pending", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCloudInitError)}, want: v1alpha1.PhasePending},
		{name: "transient error is Pending", conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonTransientError)}, want: v1alpha1.PhasePending},
		{name: "deletion wins over everything", deleting: true, conds: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError)}, want: v1alpha1.PhaseDeleting},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1alpha1.Proxy{Status: v1alpha1.ProxyStatus{Conditions: tc.conds}}
			if tc.deleting {
				p.DeletionTimestamp = &now
			}
			if got := computePhase(p); got != tc.want {
				t.Errorf("computePhase = %s, want %s", got, tc.want)
			}
		})
	}
}
