package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyfleet/proxyfleet/statuspage"
)

type paceList []statuspage.SitePace

func (l paceList) PaceStatus() []statuspage.SitePace { return l }

func TestSitePaceCollectorBoundsTheSites(t *testing.T) {
	var l paceList
	for i := range 5 {
		l = append(l, statuspage.SitePace{Site: fmt.Sprintf("s%d.com", i), Waited: uint64(10 - i), Refused: 1, Queued: 1, LearntIntervalMillis: int64(1000 * (i + 1))})
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewSitePaceCollector(l, 2))
	want := `
# HELP proxyfleet_site_pace_learnt_interval_seconds The automatic slow-down's interval per member now (0: unlimited), by site as proxyfleet_site_pace_waited_total ((other): the longest).
# TYPE proxyfleet_site_pace_learnt_interval_seconds gauge
proxyfleet_site_pace_learnt_interval_seconds{site="(other)"} 5
proxyfleet_site_pace_learnt_interval_seconds{site="s0.com"} 1
proxyfleet_site_pace_learnt_interval_seconds{site="s1.com"} 2
# HELP proxyfleet_site_pace_waited_total Requests that waited for their slot in a site's pace, for the sites most held; the rest summed as site="(other)".
# TYPE proxyfleet_site_pace_waited_total counter
proxyfleet_site_pace_waited_total{site="(other)"} 21
proxyfleet_site_pace_waited_total{site="s0.com"} 10
proxyfleet_site_pace_waited_total{site="s1.com"} 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_site_pace_learnt_interval_seconds", "proxyfleet_site_pace_waited_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(NewSitePaceCollector(l, 2)); n != 15 {
		t.Fatalf("%d series, want 3 sites x 5", n)
	}
}
