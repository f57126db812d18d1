package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLeaseRequestsCountsByOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := NewLeaseRequests(reg)
	l.LeaseRequest("granted")
	l.LeaseRequest("granted")
	l.LeaseRequest("no_match")
	want := `
# HELP proxyfleet_lease_requests_total Lease API requests by outcome.
# TYPE proxyfleet_lease_requests_total counter
proxyfleet_lease_requests_total{outcome="granted"} 2
proxyfleet_lease_requests_total{outcome="no_match"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_lease_requests_total"); err != nil {
		t.Fatal(err)
	}
}
