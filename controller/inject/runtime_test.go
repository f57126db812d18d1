package inject_test

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/controller/inject"
)

// TestSidecarRuntimeFollowsItsResources pins how the sidecar's Go runtime
// is sized: GOMAXPROCS from the CPU request (at least 2) unless a CPU limit
// is set, GOMEMLIMIT at 90 % of a memory limit.
func TestSidecarRuntimeFollowsItsResources(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources string // the gateway-resources annotation; "" for the defaults (requests.cpu=20m)
		want      []corev1.EnvVar
	}{
		{"a small CPU request runs on two processors", "",
			[]corev1.EnvVar{{Name: "GOMAXPROCS", Value: "2"}}},
		{"a CPU request above two is rounded up", "requests.cpu=2500m",
			[]corev1.EnvVar{{Name: "GOMAXPROCS", Value: "3"}}},
		{"a CPU limit leaves GOMAXPROCS to Go, which follows it", "limits.cpu=500m",
			nil},
		{"a memory limit becomes GOMEMLIMIT at 90 percent", "limits.memory=64Mi",
			[]corev1.EnvVar{{Name: "GOMAXPROCS", Value: "2"}, {Name: "GOMEMLIMIT", Value: "60397974"}}},
		{"both limits set only GOMEMLIMIT", "limits.cpu=1,limits.memory=100M",
			[]corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "90000000"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: "crawl"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "crawler", Image: "crawler:1"}}},
			}
			if tc.resources != "" {
				pod.Annotations = map[string]string{inject.AnnotationGatewayResources: tc.resources}
			}
			if err := testConfig("proxyfleet-system").Mutate(pod); err != nil {
				t.Fatal(err)
			}
			sc := pod.Spec.InitContainers[0]
			if sc.Name != inject.SidecarName {
				t.Fatalf("first init container = %q, want the sidecar", sc.Name)
			}
			if !reflect.DeepEqual(sc.Env, tc.want) {
				t.Errorf("sidecar env = %v, want %v", sc.Env, tc.want)
			}
			for _, e := range pod.Spec.Containers[0].Env {
				if e.Name == "GOMAXPROCS" || e.Name == "GOMEMLIMIT" {
					t.Errorf("the app container got %s: only the sidecar's runtime is sized", e.Name)
				}
			}
		})
	}
}
