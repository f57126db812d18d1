package gcp

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestComputeRequestsAreChildSpansOfTheProviderCall pins that the Compute
// client's own HTTP instrumentation reports to the process's tracer
// provider: a provider.get through WithTracing has the REST request as a
// client child span.
func TestComputeRequestsAreChildSpansOfTheProviderCall(t *testing.T) {
	sr, _ := spanrec.Record(t)
	p, srv := newTestProvider(t, nil)
	// A VM that is not there: the answer is a 404, the request is made.
	if _, err := providers.WithTracing(p, "gcp-test").Get(ctx(t), formatProviderID(testZone, "proxy-absent")); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("get of an absent VM: %v, want not found", err)
	}
	spanrec.RequireClientChild(t, sr, providers.SpanGet, strings.TrimPrefix(srv.URL, "http://"))
}
