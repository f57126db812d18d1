package gcp

import (
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

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

	var get sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == providers.SpanGet {
			get = s
		}
	}
	if get == nil {
		t.Fatalf("no %s span", providers.SpanGet)
	}
	if get.Status().Code == codes.Error {
		t.Errorf("a not-found get is marked failed: %v", get.Status())
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, s := range sr.Ended() {
		if s.SpanKind() == trace.SpanKindClient && s.Parent().SpanID() == get.SpanContext().SpanID() {
			for _, kv := range s.Attributes() {
				if strings.Contains(kv.Value.String(), host) {
					return
				}
			}
		}
	}
	t.Fatalf("no HTTP client span to %s under provider.get; spans: %v", host, spanrec.Names(sr.Ended()))
}
