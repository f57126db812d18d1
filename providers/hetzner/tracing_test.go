package hetzner

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestAPIRequestsAreChildSpansOfTheProviderCall pins that the hcloud-go
// client's HTTP requests report to the process's tracer provider: a
// provider.get through WithTracing has the request as a client child span.
func TestAPIRequestsAreChildSpansOfTheProviderCall(t *testing.T) {
	sr, _ := spanrec.Record(t)
	p, api := newTestProvider(t, nil)
	if _, err := providers.WithTracing(p, "hetzner-test").Get(ctx(t), formatProviderID(12345)); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("get of an absent server: %v, want not found", err)
	}
	spanrec.RequireClientChild(t, sr, providers.SpanGet, strings.TrimPrefix(api.URL, "http://"))
}
