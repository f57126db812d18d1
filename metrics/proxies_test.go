package metrics

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// stubPhases is a ProxyPhases with fixed counts, an optional error, and a
// count of reads.
type stubPhases struct {
	counts map[string]int
	err    error
	reads  atomic.Int32
	ctxOK  atomic.Bool // the last read had a deadline
}

func (s *stubPhases) ProxiesByPhase(ctx context.Context) (map[string]int, error) {
	s.reads.Add(1)
	_, ok := ctx.Deadline()
	s.ctxOK.Store(ok)
	return s.counts, s.err
}

func TestProxyCollectorReadsThePhasesAtScrapeTime(t *testing.T) {
	tests := []struct {
		name string
		src  *stubPhases
		want string
	}{
		{
			name: "one series per phase, zeros included",
			src:  &stubPhases{counts: map[string]int{"Ready": 3, "Unhealthy": 1, "Failed": 0}},
			want: `
# HELP proxyfleet_proxies Proxy objects by status.phase, read from the controller's cache at scrape time.
# TYPE proxyfleet_proxies gauge
proxyfleet_proxies{phase="Failed"} 0
proxyfleet_proxies{phase="Ready"} 3
proxyfleet_proxies{phase="Unhealthy"} 1
`,
		},
		{
			name: "an unreadable cache leaves the series out instead of failing the scrape",
			src:  &stubPhases{err: errors.New("the cache is not started")},
			want: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(NewProxyCollector(tt.src, 0))
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tt.want), "proxyfleet_proxies"); err != nil {
				t.Fatal(err)
			}
			if !tt.src.ctxOK.Load() {
				t.Error("the read had no deadline: an unsynced cache could hold the scrape forever")
			}
		})
	}
}

func TestProxyCollectorFollowsTheSourceBetweenScrapes(t *testing.T) {
	src := &stubPhases{counts: map[string]int{"Pending": 1}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewProxyCollector(src, time.Second))
	if n := testutil.CollectAndCount(reg, "proxyfleet_proxies"); n != 1 {
		t.Fatalf("%d series, want 1", n)
	}
	src.counts = map[string]int{"Ready": 2, "Deleting": 1}
	want := `
# HELP proxyfleet_proxies Proxy objects by status.phase, read from the controller's cache at scrape time.
# TYPE proxyfleet_proxies gauge
proxyfleet_proxies{phase="Deleting"} 1
proxyfleet_proxies{phase="Ready"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_proxies"); err != nil {
		t.Fatal(err)
	}
	if n := src.reads.Load(); n != 2 {
		t.Fatalf("the source was read %d times for 2 scrapes, want once per scrape", n)
	}
}
