package statuspage

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestGatewayViewBoundsThePacedSites: a crawl of many sites, each paced,
// makes a view of the MaxPaceRows most held (the input's first) and a
// count of them all, so the JSON a page polls every 2 seconds stays
// small however many sites there are.
func TestGatewayViewBoundsThePacedSites(t *testing.T) {
	paces := func(n int) []SitePace {
		out := make([]SitePace, n)
		for i := range out {
			out[i] = SitePace{Site: fmt.Sprintf("site-%06d.example", i), MinIntervalMillis: 2000, Waited: uint64(n - i)}
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		sites      int
		rows       int
		maxJSONLen int
	}{
		{"no paced site is an empty list", 0, 0, 2},
		{"a few sites are all shown", 3, 3, 1 << 10},
		{"exactly the bound is all shown", MaxPaceRows, MaxPaceRows, 20 << 10},
		{"100,000 sites are the most held 50 and a count", 100_000, MaxPaceRows, 20 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := paces(tc.sites)
			v := Gateway(GatewayInput{Paces: in}, time.Unix(0, 0))
			if len(v.Paces) != tc.rows || v.PacesTotal != tc.sites {
				t.Fatalf("%d rows, total %d; want %d rows, total %d", len(v.Paces), v.PacesTotal, tc.rows, tc.sites)
			}
			if tc.rows > 0 && (v.Paces[0].Site != in[0].Site || v.Paces[tc.rows-1].Site != in[tc.rows-1].Site) {
				t.Fatalf("rows %s..%s, want the input's first %d", v.Paces[0].Site, v.Paces[tc.rows-1].Site, tc.rows)
			}
			b, err := json.Marshal(v.Paces)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > tc.maxJSONLen {
				t.Fatalf("paces are %d bytes of JSON, want at most %d", len(b), tc.maxJSONLen)
			}
		})
	}
}
