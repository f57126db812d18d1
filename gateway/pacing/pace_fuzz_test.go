package pacing

import (
	"net/http"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// FuzzClientPaceMeetsTheOperators: whatever pace a username and the pace
// header merge to (package params' FuzzParsePaceHeaders fuzzes the
// parsing), the pacer meets it with the operator's and is never looser
// than either.
func FuzzClientPaceMeetsTheOperators(f *testing.F) {
	f.Add("crawler-pace-2s", "2s")
	f.Add("crawler", "500ms")
	f.Add("crawler-pace-1s", "2s")
	f.Add("c", "90")
	f.Add("c", "-1s")
	f.Add("c", "1000000h")
	f.Add("c;pace=1m", "1m0s")
	f.Fuzz(func(t *testing.T, user, pace string) {
		hdr := http.Header{}
		if pace != "" {
			hdr.Set(params.HeaderPace, pace)
		}
		up, err := params.ParseUsername(user)
		if err != nil {
			return
		}
		hp, err := params.ParseHeaders(hdr)
		if err != nil {
			return
		}
		p, err := params.Merge(up, hp)
		if err != nil {
			return
		}
		pc := New(Options{Default: rotation.PaceLimits{MinInterval: time.Second}}, nil, nil)
		if lim, _ := pc.o.explicitFor("example.com", p.Pace); lim.MinInterval < time.Second || lim.MinInterval < p.Pace {
			t.Fatalf("pace %v with the operator's 1s gave %v", p.Pace, lim.MinInterval)
		}
	})
}
