package pacing

import (
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// FuzzParseSitePaces: an entry that reads gives its exact host limits of
// zero or more, and the default for what it does not name.
func FuzzParseSitePaces(f *testing.F) {
	for _, s := range []string{"*.example.com min-interval=2s max-concurrency=4", "a.example max-concurrency=0", "a.example min-interval=-1s", "a.example", "a.example foo=1", "a.example min-interval=1s min-interval=2s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		def := rotation.PaceLimits{MinInterval: 3 * time.Second, MaxConcurrency: 7}
		sp, err := ParseSitePaces([]string{entry}, def)
		if err != nil {
			return
		}
		fields := strings.Fields(entry)
		key, wild, err := sites.ParsePattern(fields[0])
		if err != nil {
			t.Fatalf("%q accepted with a pattern that does not read: %v", entry, err)
		}
		host := key
		if wild {
			host = "sub" + key
		}
		lim, ok := sp.For(host)
		if !ok || lim.MinInterval < 0 || lim.MaxConcurrency < 0 {
			t.Fatalf("%q: For(%q) = %+v, %v", entry, host, lim, ok)
		}
		if !strings.Contains(entry, "min-interval=") && lim.MinInterval != def.MinInterval {
			t.Fatalf("%q names no min-interval but changed it to %v", entry, lim.MinInterval)
		}
		if !strings.Contains(entry, "max-concurrency=") && lim.MaxConcurrency != def.MaxConcurrency {
			t.Fatalf("%q names no max-concurrency but changed it to %d", entry, lim.MaxConcurrency)
		}
	})
}
