package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestFleetRowsShowAddressesPoolsAndWhyAProxyIsNotReady(t *testing.T) {
	created := metav1.NewTime(time.Unix(1_700_000_000, 0))
	checked := metav1.NewTime(time.Unix(1_700_000_100, 0))
	proxies := []v1alpha1.Proxy{
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ext", CreationTimestamp: created},
			Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "10.0.0.7", Port: 3128,
				CredentialsSecretRef: &v1alpha1.SecretRef{Name: "login"}}},
			Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, LatencyMillis: 12,
				Conditions: []metav1.Condition{{Type: "Healthy", Status: metav1.ConditionTrue}}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "eu-1", Labels: map[string]string{v1alpha1.LabelPool: "eu"}},
			Spec:       v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: "gce"},
			Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Conditions: []metav1.Condition{
				{Type: "Healthy", Status: metav1.ConditionUnknown, Reason: "NotProbed", Message: "no address yet"}}},
		},
	}
	pools := []v1alpha1.ProxyPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "eu"},
		Status: v1alpha1.ProxyPoolStatus{DesiredReplicas: 3, Replicas: 2, ReadyReplicas: 1, DrainingReplicas: 1}}}
	phs := []v1alpha1.ProviderHealth{{ObjectMeta: metav1.ObjectMeta{Name: "gce"}, Status: v1alpha1.ProviderHealthStatus{
		Type: "gcp", TargetsReady: "0/1", LastCheckTime: &checked,
		Targets: []v1alpha1.ProviderTarget{{Name: "project", Reason: "PermissionDenied", Message: "compute.instances.list"}}}}}

	px, pl, pr := FleetRows(proxies, pools, phs)
	if px[0].Address != "10.0.0.7:3128" || px[0].LatencyMillis != 12 || px[0].Message != "" || !px[0].CreatedAt.Equal(created.Time) || px[0].Provider != "" {
		t.Errorf("External Proxy row %+v", px[0])
	}
	if px[1].Address != "" || px[1].Pool != "eu" || px[1].Provider != "gce" || px[1].Message != "Healthy: NotProbed: no address yet" {
		t.Errorf("Managed Proxy row %+v", px[1])
	}
	if pl[0].Desired != 3 || pl[0].Current != 2 || pl[0].Ready != 1 || pl[0].Draining != 1 {
		t.Errorf("pool row %+v", pl[0])
	}
	if pr[0].Type != "gcp" || pr[0].Ready || pr[0].LastCheck == nil || !pr[0].LastCheck.Equal(checked.Time) ||
		len(pr[0].Targets) != 1 || pr[0].Targets[0].Reason != "PermissionDenied" {
		t.Errorf("provider row %+v", pr[0])
	}
}
