package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestProviderRequestsCountByProviderOpAndResult(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p := NewProviderRequests(reg)
	p.ProviderRequest("in-cluster", "create", "ok")
	p.ProviderRequest("in-cluster", "create", "ok")
	p.ProviderRequest("in-cluster", "get", "not_found")
	want := `
# HELP proxyfleet_provider_requests_total Provider calls by provider entry, operation (create, get, delete, list) and result (ok, transient, permanent, quota_exceeded, not_found).
# TYPE proxyfleet_provider_requests_total counter
proxyfleet_provider_requests_total{op="create",provider="in-cluster",result="ok"} 2
proxyfleet_provider_requests_total{op="get",provider="in-cluster",result="not_found"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_provider_requests_total"); err != nil {
		t.Fatal(err)
	}
}
