package testutil

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// RecordSpans installs, for the rest of t, a tracer provider that samples
// every span into the returned in-memory recorder as the global one, which
// is where the code under test (the Compute client, libvirt RPCs, reconciles,
// sweeps) finds its tracer. Cleanup shuts the provider down, so tracers other
// code took from it stop recording, and puts the previous global back.
func RecordSpans(t testing.TB) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
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
