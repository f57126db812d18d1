//go:build sidecar

package tracing

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newOTLPHTTP is the sidecar build's own OTLP/HTTP exporter
// (otlpHTTPExporter): go.opentelemetry.io's links gRPC and the generated
// OTLP packages, which every crawler pod would pay for at start.
func newOTLPHTTP(_ context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	return newOTLPHTTPExporter(getenv)
}

// newOTLPGRPC refuses OTLP over gRPC, which the sidecar build leaves out
// (the gRPC stack and the generated OTLP packages cost an idle sidecar ≈ 1.5 MiB and 2.7 MB of binary).
func newOTLPGRPC(_ context.Context, variable string) (sdktrace.SpanExporter, error) {
	return nil, fmt.Errorf("%s=%s: this build (proxyfleet-sidecar) exports OTLP over HTTP only: use %s (the default), or the full proxyfleet binary for gRPC",
		variable, ProtocolGRPC, ProtocolHTTP)
}
