// Package spanrec records the spans code under test makes: Record installs
// an always-sampling tracer provider with an in-memory recorder as
// OpenTelemetry's global one for the rest of a test, Provider makes the same
// for code that is handed its provider, and Names, Attr and RequireClientChild read the spans.
//
// It imports OpenTelemetry's SDK and nothing of ours; it is a package of
// its own so that a test or program that records no spans (e2e/bench) does
// not link the SDK through internal/testutil.
package spanrec

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Record installs, for the rest of t, a tracer provider that samples
// every span into the returned in-memory recorder as the global one, which
// is where the code under test (the Compute client, libvirt RPCs, reconciles,
// sweeps) finds its tracer. Cleanup shuts the provider down, so tracers other
// code took from it stop recording, and puts the previous global back.
func Record(t testing.TB) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(prev)
	})
	return sr, tp
}

// Provider is a tracer provider that samples every span into the returned
// recorder, for code that is handed its provider (the lease API's server,
// the health engine's probes) rather than taking the global one. Cleanup
// shuts it down.
func Provider(t testing.TB) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return sr, tp
}

// Names are the spans' names, in order.
func Names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

// Attr is the value of s's attribute key, if it has one.
func Attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// RequireClientChild fails t unless sr has an ended span named parent that
// is not marked failed and, under it, a client span with an attribute
// naming host: how a provider's test pins that its cloud SDK's HTTP
// requests report to the process's tracer below the provider call.
func RequireClientChild(t testing.TB, sr *tracetest.SpanRecorder, parent, host string) {
	t.Helper()
	var p sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == parent {
			p = s
		}
	}
	if p == nil {
		t.Fatalf("no %s span; spans: %v", parent, Names(sr.Ended()))
	}
	if p.Status().Code == codes.Error {
		t.Errorf("%s is marked failed: %v", parent, p.Status())
	}
	for _, s := range sr.Ended() {
		if s.SpanKind() == trace.SpanKindClient && s.Parent().SpanID() == p.SpanContext().SpanID() {
			for _, kv := range s.Attributes() {
				if strings.Contains(kv.Value.String(), host) {
					return
				}
			}
		}
	}
	t.Fatalf("no HTTP client span to %s under %s; spans: %v", host, parent, Names(sr.Ended()))
}
