package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestLatchHoldsOnlyForTheFailedGeneration(t *testing.T) {
	p := &v1alpha1.Proxy{}
	p.Generation = 3
	setProvisioned(p, metav1.ConditionFalse, v1alpha1.ReasonPermanentError, "bad machine type")
	if !latched(p) {
		t.Fatalf("not latched at the generation that failed")
	}
	p.Generation = 4
	if latched(p) {
		t.Fatalf("still latched after a spec edit")
	}
	for _, reason := range []string{v1alpha1.ReasonQuotaExceeded, v1alpha1.ReasonProviderNotConfigured, v1alpha1.ReasonCloudInitError} {
		setProvisioned(p, metav1.ConditionFalse, reason, "waiting")
		if latched(p) {
			t.Errorf("%s latched", reason)
		}
	}
}
