package kvm

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestRPCSpansAreChildrenOfTheProviderCall runs a Get against a real
// libvirtd over SSH with an in-memory exporter installed globally: every
// libvirt RPC the call makes is one client span under provider.get.
func TestRPCSpansAreChildrenOfTheProviderCall(t *testing.T) {
	sr, _ := spanrec.Record(t)
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
