//go:build sidecar

package tracing

import (
	"context"
	"strings"
	"testing"
)

// TestSidecarExportsOTLPOverHTTPOnly: the sidecar build's otlp exporter is
// its own OTLP/HTTP one, and gRPC is refused at start naming the variable
// and the way out, never silently dropped.
func TestSidecarExportsOTLPOverHTTPOnly(t *testing.T) {
	restoreGlobals(t)
	tr, err := Setup(context.Background(), Options{Getenv: env(map[string]string{EnvEndpoint: "http://127.0.0.1:4318"})})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() {
		t.Fatal("tracing is off with an OTLP endpoint")
	}
	_ = tr.Shutdown(context.Background())
	exp, err := newOTLPHTTP(context.Background(), env(nil))
	if _, own := exp.(*otlpHTTPExporter); err != nil || !own {
		t.Fatalf("the sidecar's OTLP/HTTP exporter is %T (%v), want its own", exp, err)
	}
	_, err = Setup(context.Background(), Options{Getenv: env(map[string]string{EnvEndpoint: "http://127.0.0.1:4317", EnvTracesProtocol: ProtocolGRPC})})
	if err == nil || !strings.Contains(err.Error(), EnvTracesProtocol) || !strings.Contains(err.Error(), "HTTP only") {
		t.Fatalf("OTLP over gRPC in the sidecar build: %v, want a refusal naming %s", err, EnvTracesProtocol)
	}
}
