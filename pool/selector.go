package pool

import (
	"fmt"
	"strings"
	"unicode"
)

// ParseSelector reads an attribute selector written key=value,key=value (the
// form of the gateway's --pool-selector and the proxyfleet.io/selector pod
// annotation). Keys and values are non-empty and free of blanks, control
// characters, commas and '=' (a selector is echoed in logs and answers,
// where a line break would forge a line); a key given twice is an error.
// Empty input is the empty selector (nil).
func ParseSelector(s string) (map[string]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		k, v, ok := strings.Cut(pair, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("selector %q: %q is not key=value", s, pair)
		case k == "" || v == "":
			return nil, fmt.Errorf("selector %q: %q has an empty key or value", s, pair)
		case !selectorWord(k) || !selectorWord(v):
			return nil, fmt.Errorf("selector %q: %q: keys and values hold no blanks, control characters or '='", s, pair)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("selector %q: key %q given twice", s, k)
		}
		out[k] = v
	}
	return out, nil
}

// selectorWord reports a key or value without blanks, control characters
// or '='.
func selectorWord(s string) bool {
	for _, r := range s {
		if r == '=' || unicode.IsSpace(r) || unicode.IsControl(r) {
			return false
		}
	}
	return true
}
