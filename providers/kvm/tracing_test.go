package kvm

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/providers"
)

// TestRPCSpansAreChildrenOfTheProviderCall runs a Get against a real
// libvirtd over SSH with an in-memory exporter installed globally: every
// libvirt RPC the call makes is one client span under provider.get.
func TestRPCSpansAreChildrenOfTheProviderCall(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(prev)
	})
	f := startFixture(t)
	p := providers.WithTracing(newProvider(t, f.config()), "kvm-test")
	if _, err := p.Get(ctx(t), FormatProviderID("local", "proxy-absent0000000")); providers.Class(err) != providers.ErrNotFound {
		t.Fatalf("Get of an absent domain: %v, want not found", err)
	}

	var get sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == providers.SpanGet {
			get = s
		}
	}
	if get == nil {
		t.Fatalf("no %s span among %d", providers.SpanGet, len(sr.Ended()))
	}
	rpcs := map[string]bool{}
	for _, s := range sr.Ended() {
		if s.Parent().SpanID() != get.SpanContext().SpanID() {
			continue
		}
		if s.SpanKind() != trace.SpanKindClient {
			t.Errorf("child span %q kind %v, want client", s.Name(), s.SpanKind())
		}
		rpcs[s.Name()] = true
	}
	if !rpcs["libvirt.DomainLookupByName"] {
		t.Fatalf("no libvirt.DomainLookupByName span under provider.get; children: %v", rpcs)
	}
}
