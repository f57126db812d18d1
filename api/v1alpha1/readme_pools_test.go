package v1alpha1_test

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestReadmeSizeTheFleetManifestsAreAccepted creates every YAML manifest of
// the README's "Size the fleet" section (pools and the HPA) on the real API
// server, so the examples cannot drift from the CRD.
func TestReadmeSizeTheFleetManifestsAreAccepted(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	text := string(raw)
	start := strings.Index(text, "\n## Size the fleet\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Size the fleet" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	ns := env.Namespace(t)
	blocks := strings.Split(section, "```yaml\n")[1:]
	if len(blocks) < 3 {
		t.Fatalf("found %d YAML blocks, want the pool, the HPA and the autoscaled pool", len(blocks))
	}
	kinds := map[string]int{}
	for _, b := range blocks {
		manifest := b[:strings.Index(b, "```")]
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
			t.Fatalf("README manifest does not parse: %v\n%s", err, manifest)
		}
		u.SetNamespace(ns)
		if err := env.Client.Create(ctx(t), &u); err != nil {
			t.Errorf("README %s %s is refused by the API server: %v", u.GetKind(), u.GetName(), err)
		}
		kinds[u.GetKind()]++
	}
	if kinds["ProxyPool"] != 2 || kinds["HorizontalPodAutoscaler"] != 1 {
		t.Errorf("README manifests by kind = %v, want 2 ProxyPools and 1 HorizontalPodAutoscaler", kinds)
	}
}
