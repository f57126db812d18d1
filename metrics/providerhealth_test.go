package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// checkRow is one target's latest check, as the monitor would report it.
type checkRow struct {
	provider, target string
	up               bool
	duration         time.Duration
	at               time.Time
}

// stubChecks is a ProviderChecks that reports fixed rows.
type stubChecks []checkRow

func (s stubChecks) EachTarget(fn func(provider, target string, up bool, duration time.Duration, checkedAt time.Time)) {
	for _, r := range s {
		fn(r.provider, r.target, r.up, r.duration, r.at)
	}
}

func TestProviderHealthCollectorReadsTheSnapshotAtScrapeTime(t *testing.T) {
	at := time.Unix(1767268800, 500_000_000)
	tests := []struct {
		name   string
		rows   stubChecks
		metric string
		want   string
	}{
		{
			name:   "a ready target is up 1 and a failing one 0",
			rows:   stubChecks{{"in-cluster", "apiserver", true, 20 * time.Millisecond, at}, {"kvm-home", "beelink", false, 15 * time.Second, at}},
			metric: "proxyfleet_provider_target_up",
			want: `
# HELP proxyfleet_provider_target_up 1 when the latest check found the provider target usable, else 0.
# TYPE proxyfleet_provider_target_up gauge
proxyfleet_provider_target_up{provider="in-cluster",target="apiserver"} 1
proxyfleet_provider_target_up{provider="kvm-home",target="beelink"} 0
`,
		},
		{
			name:   "the check duration is in seconds",
			rows:   stubChecks{{"in-cluster", "apiserver", true, 250 * time.Millisecond, at}},
			metric: "proxyfleet_provider_check_duration_seconds",
			want: `
# HELP proxyfleet_provider_check_duration_seconds How long the latest check of the provider took (the timeout when it did not return).
# TYPE proxyfleet_provider_check_duration_seconds gauge
proxyfleet_provider_check_duration_seconds{provider="in-cluster",target="apiserver"} 0.25
`,
		},
		{
			name:   "the check timestamp is Unix seconds",
			rows:   stubChecks{{"in-cluster", "apiserver", true, 0, at}},
			metric: "proxyfleet_provider_check_timestamp_seconds",
			want: `
# HELP proxyfleet_provider_check_timestamp_seconds Unix time the latest check of the provider finished; alert when it stops moving.
# TYPE proxyfleet_provider_check_timestamp_seconds gauge
proxyfleet_provider_check_timestamp_seconds{provider="in-cluster",target="apiserver"} 1.7672688005e+09
`,
		},
		{
			name:   "an empty snapshot (a non-leader) exports nothing",
			rows:   nil,
			metric: "proxyfleet_provider_target_up",
			want:   "",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(NewProviderHealthCollector(tc.rows))
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), tc.metric); err != nil {
				t.Fatal(err)
			}
		})
	}
}
