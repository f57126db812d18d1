package inject_test

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/controller/inject"
)

// update rewrites the golden files: go test ./controller/inject -run Golden -update
var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml")

// TestMutatedPodsMatchTheGoldenFiles pins the whole mutation: a change to
// what injected pods look like shows up as a reviewable diff.
func TestMutatedPodsMatchTheGoldenFiles(t *testing.T) {
	cfg := testConfig("proxyfleet-system")
	targets := cfg
	targets.ClusterTargets = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		cfg  *inject.Config // nil: cfg
	}{
		{"plain", &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: "crawl", Labels: map[string]string{inject.LabelInject: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "crawler", Image: "crawler:1"}}},
		}, nil},
		{"annotated-mitm-with-init", &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: "crawl", Labels: map[string]string{inject.LabelInject: "true"},
				Annotations: map[string]string{inject.AnnotationSelector: "tier=dc,region=eu", inject.AnnotationRotation: "per-request",
					inject.AnnotationNoProxy: ".internal.example", inject.AnnotationGatewayResources: "limits.cpu=200m", inject.AnnotationMITM: "crawl-mitm-ca",
					inject.AnnotationUpstreamCA: "site-roots/bundle.pem"}},
			Spec: corev1.PodSpec{ServiceAccountName: "crawler",
				InitContainers: []corev1.Container{{Name: "migrate", Image: "migrate:1"}},
				Containers: []corev1.Container{{Name: "crawler", Image: "crawler:1",
					Env: []corev1.EnvVar{{Name: "NO_PROXY", Value: "mine.example"}}}}},
		}, nil},
		// The cluster's own ranges admitted (the chart's clusterTargets):
		// the sidecar gets them as --cluster-target-cidrs; NO_PROXY is as
		// without them.
		{"cluster-targets", &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: "crawl", Labels: map[string]string{inject.LabelInject: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "crawler", Image: "crawler:1"}}},
		}, &targets},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cfg
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			if want, _, _ := cfg.Wanted(tc.pod, nil); !want {
				t.Fatal("the pod is not wanted")
			}
			if err := cfg.Mutate(tc.pod); err != nil {
				t.Fatal(err)
			}
			if want, _, _ := cfg.Wanted(tc.pod, map[string]string{inject.LabelInject: "true"}); want {
				t.Fatal("an injected pod would be injected again")
			}
			got, err := yaml.Marshal(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if string(got) != string(want) {
				t.Fatalf("mutated pod differs from %s (run with -update after checking):\n%s", path, got)
			}
		})
	}
}
