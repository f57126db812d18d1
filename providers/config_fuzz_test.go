package providers

import "testing"

// FuzzParseConfig feeds the providers config file (outside input) through
// the file's shape, which this package reads: it never panics, and a config
// it accepts has entries with unique, non-empty names, each of a known type
// and with its block. Each provider package fuzzes its own block
// (FuzzReadConfig in providers/kubernetes, providers/gcp, providers/kvm,
// providers/aws, providers/digitalocean, providers/hetzner).
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(docsExample))
	f.Add([]byte("providers:\n- name: a\n  type: kubernetes\n"))
	f.Add([]byte("providers: [{name: a, type: gcp, project: p}, {name: a, type: gcp}]\n"))
	f.Add([]byte("providers: [{name: a, type: kvm, kvm: {fail: [x]}, gcp: {}}]\n"))
	f.Add([]byte("providers: {}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := ParseConfig(in, testTypes)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, e := range cfg.Providers {
			if e.Name == "" || seen[e.Name] {
				t.Fatalf("accepted an entry without a unique name: %+v in %q", e, in)
			}
			seen[e.Name] = true
			if testTypes[e.Type] == nil || e.block == nil {
				t.Fatalf("accepted an entry of an unknown type or without its block: %+v in %q", e, in)
			}
		}
	})
}
