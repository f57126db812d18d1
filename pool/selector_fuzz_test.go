package pool

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// FuzzParseSelector reads a selector as crawlers and pod annotations write
// it: one that reads has non-empty keys and values free of the separators,
// and reads back the same when written out.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"region=eu,tier=premium", " a=1 , b=2 ", "", "a", "a=", "=b", "a=1,a=2", "a=b=c", "a b=c", "a=1,,b=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			if !strings.Contains(err.Error(), "selector") {
				t.Fatalf("error %q does not say what it read", err)
			}
			return
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(sel)) {
			v := sel[k]
			for _, part := range []string{k, v} {
				if part == "" || strings.ContainsAny(part, "=,") || !selectorWord(part) {
					t.Fatalf("%q: %q=%q holds an empty part, a separator or blanks", s, k, v)
				}
			}
			out = append(out, k+"="+v)
		}
		again, err := ParseSelector(strings.Join(out, ","))
		if err != nil || !maps.Equal(again, sel) {
			t.Fatalf("%q: %v written out reads back as %v, %v", s, sel, again, err)
		}
	})
}
