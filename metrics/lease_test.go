package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

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

// outcomes is an OutcomeTap that keeps what it got.
type outcomes []string

func (o *outcomes) Add(outcome string) { *o = append(*o, outcome) }

func TestRecordersFeedTheirOutcomeTaps(t *testing.T) {
	var gw, leases outcomes
	m := New(prometheus.NewRegistry(), nil, &gw)
	m.Request("squid-a", "ok", time.Millisecond)
	m.Request("", "no_member", time.Millisecond)
	l := NewLeaseRequests(prometheus.NewRegistry(), &leases, nil)
	l.LeaseRequest("granted")
	if fmt.Sprint(gw) != "[ok no_member]" || fmt.Sprint(leases) != "[granted]" {
		t.Fatalf("taps got %v and %v", gw, leases)
	}
}
