package aws

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestEC2RequestsAreChildSpansOfTheProviderCall pins that the EC2 client's
// HTTP requests report to the process's tracer provider: a provider.get
// through WithTracing has the request as a client child span.
func TestEC2RequestsAreChildSpansOfTheProviderCall(t *testing.T) {
	sr, _ := spanrec.Record(t)
	p, srv := newTestProvider(t, nil)
	if _, err := providers.WithTracing(p, "aws-test").Get(ctx(t), formatProviderID(testZone, "i-0123456789abcdef0")); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("get of an absent instance: %v, want not found", err)
	}
	spanrec.RequireClientChild(t, sr, providers.SpanGet, strings.TrimPrefix(srv.URL, "http://"))
}
