package gen

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestProxyBuildsWhatTheLiteralWould(t *testing.T) {
	got := Proxy("px", SetProxyNamespace("ns"), SetProxyManaged("kvm"), SetProxyPort(3129),
		SetProxyPlacement(v1alpha1.Placement{Zone: "z"}), SetProxyCloudInit("#cloud-config\n"), nil)
	want := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "px"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: "kvm", Port: 3129,
			Placement: &v1alpha1.Placement{Zone: "z"}, CloudInit: &v1alpha1.CloudInit{Inline: "#cloud-config\n"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Proxy = %+v\nwant  %+v", got, want)
	}
	if p := Proxy("px", SetProxyProvider("in-cluster")); !reflect.DeepEqual(p.Spec, v1alpha1.ProxySpec{Provider: "in-cluster"}) {
		t.Fatalf("SetProxyProvider spec = %+v, want only the provider (mode left to the API's default)", p.Spec)
	}
	if a, b := Proxy("a"), Proxy("a"); a.Spec.Endpoint == b.Spec.Endpoint {
		t.Fatal("two Proxies share one Endpoint: a test's edit of one would change the other")
	}
}

func TestProxyPoolBuildsWhatTheLiteralWould(t *testing.T) {
	got := ProxyPool("eu", SetProxyPoolNamespace("ns"), SetProxyPoolReplicas(2), SetProxyPoolDrainSeconds(3),
		SetProxyPoolTemplate(v1alpha1.ProxySpec{Provider: "in-cluster"}), SetProxyPoolTemplateLabels(map[string]string{"a": "b"}))
	two, three := int32(2), int32(3)
	want := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "eu"},
		Spec: v1alpha1.ProxyPoolSpec{Replicas: &two, DrainSeconds: &three, Template: v1alpha1.ProxyTemplate{
			Metadata: v1alpha1.ProxyTemplateMeta{Labels: map[string]string{"a": "b"}},
			Spec:     v1alpha1.ProxySpec{Provider: "in-cluster"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ProxyPool = %+v\nwant      %+v", got, want)
	}
}
