//go:build !sidecar

package tracing

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newOTLPHTTP is go.opentelemetry.io's OTLP/HTTP exporter; it reads the
// endpoint, headers, TLS and timeout variables from the process's
// environment itself.
func newOTLPHTTP(ctx context.Context, _ func(string) string) (sdktrace.SpanExporter, error) {
	return otlptracehttp.New(ctx)
}

// newOTLPGRPC is go.opentelemetry.io's OTLP/gRPC exporter, reading the
// same variables.
func newOTLPGRPC(ctx context.Context, _ string) (sdktrace.SpanExporter, error) {
	return otlptracegrpc.New(ctx)
}
