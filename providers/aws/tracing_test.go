package aws

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

// TestEC2RequestsAreChildSpansOfTheProviderCall pins that the EC2 client's
// HTTP requests report to the process's tracer provider: a provider.get
// through WithTracing has the request as a client child span.
func TestEC2RequestsAreChildSpansOfTheProviderCall(t *testing.T) {
	sr, _ := spanrec.Record(t)
	p, srv := newTestProvider(t, nil)
	if _, err := providers.WithTracing(p, "aws-test").Get(ctx(t), formatProviderID(testZone, "i-0123456789abcdef0")); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("get of an absent instance: %v, want not found", err)
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
