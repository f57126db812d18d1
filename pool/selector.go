package pool

import (
	"fmt"
	"strings"
)

// ParseSelector reads an attribute selector written key=value,key=value (the
// form of the gateway's --pool-selector and the proxyfleet.io/selector pod
// annotation). Keys and values are non-empty and free of spaces, commas and
// '='; a key given twice is an error. Empty input is the empty selector (nil).
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
		case strings.ContainsAny(k, " \t=") || strings.ContainsAny(v, " \t="):
			return nil, fmt.Errorf("selector %q: %q: keys and values hold no spaces or '='", s, pair)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("selector %q: key %q given twice", s, k)
		}
		out[k] = v
	}
	return out, nil
}
