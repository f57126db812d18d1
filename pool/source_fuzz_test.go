package pool

import (
	"strings"
	"testing"
)

// FuzzParseUpstreamsFile feeds the upstreams file (written by people, so
// outside input): it never panics, and what it accepts are members with a
// name and exactly one of an upstream URL or a source address, with
// unique names.
func FuzzParseUpstreamsFile(f *testing.F) {
	f.Add("# comment\nhttp://10.0.0.1:3128 region=eu\nsocks5://u:p@10.0.0.2:1080 name=s tier=dc\n")
	f.Add("https://proxy.example:443\n\n   \n# only comments\n")
	f.Add("http://10.0.0.1:3128 region=eu region=us\n")
	f.Add("ftp://x:1\n")
	f.Fuzz(func(t *testing.T, in string) {
		ms, err := parseUpstreamsFile(strings.NewReader(in))
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, m := range ms {
			if m.Name == "" || seen[m.Name] {
				t.Fatalf("accepted a member without a unique name: %+v in %q", m, in)
			}
			seen[m.Name] = true
			if (m.URL == nil) == !m.SourceAddr.IsValid() {
				t.Fatalf("accepted a member with neither or both of URL and source address: %+v", m)
			}
		}
	})
}
