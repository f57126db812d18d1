package providers

import "testing"

// FuzzParseConfig feeds the providers config file (outside input): it never
// panics, and a config it accepts has entries with unique, non-empty names.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(docsExample))
	f.Add([]byte("providers:\n- name: a\n  type: kubernetes\n"))
	f.Add([]byte("providers: [{name: a, type: gcp, project: p}, {name: a, type: gcp}]\n"))
	f.Add([]byte("providers: {}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := ParseConfig(in)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, e := range cfg.Providers {
			if e.Name == "" || seen[e.Name] {
				t.Fatalf("accepted an entry without a unique name: %+v in %q", e, in)
			}
			seen[e.Name] = true
		}
	})
}
