package promql

import (
	"slices"
	"testing"
)

func TestMetricNamesSkipsFunctionsLabelsStringsAndKeywords(t *testing.T) {
	tests := []struct {
		name, expr string
		want       []string
	}{
		{"a rate summed by a label", `sum by (outcome) (rate(proxyfleet_gateway_requests_total{outcome=~"banned|x_total"}[$__rate_interval]))`,
			[]string{"proxyfleet_gateway_requests_total"}},
		{"a ratio with a number and a clamp", `sum(proxyfleet_leases_active) / clamp_min(sum(proxyfleet_members{healthy="true"}), 1e3)`,
			[]string{"proxyfleet_leases_active", "proxyfleet_members"}},
		{"a join with on and group_left", `a_metric >= on (namespace, job) group_left () sum by (namespace) (b_metric) and on(job) c_metric > 0.5`,
			[]string{"a_metric", "b_metric", "c_metric"}},
		{"time() is a function, offset a keyword", `time() - max by (p) (ts_seconds offset 5m)`, []string{"ts_seconds"}},
		{"a bare selector with a regex of specials", `sum(x{site!~"\\*|\\(other\\)"})`, []string{"x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MetricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Fatalf("MetricNames(%s) = %v, want %v", tc.expr, got, tc.want)
			}
		})
	}
}
