//go:build !sidecar

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

// TestProvidersConfigDocExamplesRead reads every providers config file the
// provider docs show, and every block shown alone (a YAML example starting
// with "kvm:"), as the binary reads --providers-config: each type's block by
// its own package. A digest placeholder ("<64 hex>") stands for a digest.
func TestProvidersConfigDocExamplesRead(t *testing.T) {
	files, err := filepath.Glob("../../docs/providers/*.md")
	if err != nil {
		t.Fatal(err)
	}
	digest := regexp.MustCompile(`"<64[^">]*>"`)
	n := 0
	for _, f := range append(files, "../../docs/providers.md") {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, example := range strings.Split(string(raw), "```yaml\n")[1:] {
			example, _, _ = strings.Cut(example, "```")
			file, ok := providersFile(example)
			if !ok {
				continue
			}
			n++
			file = digest.ReplaceAllString(file, `"`+strings.Repeat("0", 64)+`"`)
			if _, err := providers.ParseConfig([]byte(file), providerDecoders()); err != nil {
				t.Errorf("%s, YAML example %d: %v\n%s", filepath.Base(f), i+1, err, file)
			}
		}
	}
	if n < 4 {
		t.Fatalf("found %d providers config examples in the docs, want at least docs/providers.md's two, gcp.md's and kvm.md's", n)
	}
}

// providersFile is a YAML example as a providers config file: a whole file
// (it has the key providers) or one type's block, made an entry "doc".
func providersFile(example string) (string, bool) {
	if strings.HasPrefix(example, "providers:") || strings.Contains(example, "\nproviders:") {
		return example, true
	}
	typ, _, _ := strings.Cut(example, ":")
	if _, ok := providerDecoders()[typ]; !ok {
		return "", false
	}
	return "providers:\n- name: doc\n  type: " + typ + "\n" + regexp.MustCompile(`(?m)^`).ReplaceAllString(example, "  "), true
}

// TestProvidersConfigNamesEveryBrokenEntry: one file with a broken block of
// each type reports every one, each naming its entry and field.
func TestProvidersConfigNamesEveryBrokenEntry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "providers.yaml")
	if err := os.WriteFile(path, []byte(`providers:
- {name: a, type: gcp, gcp: {}}
- {name: b, type: kubernetes, kubernetes: {}}
- {name: c, type: kvm, kvm: {ssh: {user: u, privateKeyFile: /i, knownHostsFile: /k}, hosts: []}}
- {name: d, type: azure}
- {name: e, type: aws, aws: {region: eu-west-1}}
- {name: f, type: digitalocean, digitalocean: {region: ams3, sourceRanges: [203.0.113.0/24]}}
- {name: g, type: hetzner, hetzner: {location: fsn1, tokenFile: /t}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := loadProvidersConfig(path)
	for _, want := range []string{"--providers-config: providers config " + path,
		"providers[0] (a): gcp.project is required", "providers[1] (b): kubernetes.namespace is required",
		"providers[2] (c): kvm.hosts needs at least one host", `providers[3] (d): type "azure" is unknown (want one of aws, digitalocean, gcp, hetzner, kubernetes, kvm)`,
		"providers[4] (e): aws.sourceRanges is required", "providers[5] (f): digitalocean.tokenFile is required",
		"providers[6] (g): hetzner.sourceRanges is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if cfg, err := loadProvidersConfig(""); cfg != nil || err != nil {
		t.Fatalf("no --providers-config = %v, %v; want no config", cfg, err)
	}
}
