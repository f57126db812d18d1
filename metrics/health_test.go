package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestHealthChecksRecordEveryProbeAndForgetPrunedProxies(t *testing.T) {
	tests := []struct {
		name   string
		record func(h *HealthChecks)
		metric string
		want   string
	}{
		{
			name: "failures are counted per proxy, with an explicit zero for a proxy that never failed",
			record: func(h *HealthChecks) {
				h.ObserveProbe("ns/a", 10*time.Millisecond, true)
				h.ObserveProbe("ns/b", time.Second, false)
				h.ObserveProbe("ns/b", time.Second, false)
			},
			metric: "proxyfleet_healthcheck_failures_total",
			want: `
# HELP proxyfleet_healthcheck_failures_total Failed health probes through a Proxy.
# TYPE proxyfleet_healthcheck_failures_total counter
proxyfleet_healthcheck_failures_total{proxy="ns/a"} 0
proxyfleet_healthcheck_failures_total{proxy="ns/b"} 2
`,
		},
		{
			name: "every probe's duration is observed, successful or not",
			record: func(h *HealthChecks) {
				h.ObserveProbe("ns/a", 20*time.Millisecond, true)
				h.ObserveProbe("ns/a", 3*time.Second, false)
			},
			metric: "proxyfleet_healthcheck_duration_seconds",
			want: `
# HELP proxyfleet_healthcheck_duration_seconds Duration of every health probe through a Proxy, successful or not.
# TYPE proxyfleet_healthcheck_duration_seconds histogram
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.005"} 0
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.01"} 0
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.025"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.05"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.1"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.25"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="0.5"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="1"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="2.5"} 1
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="5"} 2
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="10"} 2
proxyfleet_healthcheck_duration_seconds_bucket{proxy="ns/a",le="+Inf"} 2
proxyfleet_healthcheck_duration_seconds_sum{proxy="ns/a"} 3.02
proxyfleet_healthcheck_duration_seconds_count{proxy="ns/a"} 2
`,
		},
		{
			name: "a forgotten proxy leaves no series behind, others stay",
			record: func(h *HealthChecks) {
				h.ObserveProbe("ns/gone", time.Millisecond, false)
				h.ObserveProbe("ns/kept", time.Millisecond, true)
				h.Forget("ns/gone")
			},
			metric: "proxyfleet_healthcheck_failures_total",
			want: `
# HELP proxyfleet_healthcheck_failures_total Failed health probes through a Proxy.
# TYPE proxyfleet_healthcheck_failures_total counter
proxyfleet_healthcheck_failures_total{proxy="ns/kept"} 0
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			h := NewHealthChecks(reg)
			tc.record(h)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), tc.metric); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHealthChecksStampTheLastProbe(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := NewHealthChecks(reg)
	before := float64(time.Now().Unix())
	h.ObserveProbe("ns/a", time.Millisecond, true)
	got := testutil.ToFloat64(h.lastProbe.WithLabelValues("ns/a"))
	if got < before || got > float64(time.Now().Unix()+1) {
		t.Fatalf("last probe timestamp %v, want about now (%v)", got, before)
	}
	h.Forget("ns/a")
	if n := testutil.CollectAndCount(h.lastProbe); n != 0 {
		t.Fatalf("%d last-probe series left after Forget", n)
	}
}
