//go:build sidecar

package tracing

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Handler gives every request to h one server span, parented on the
// request's traceparent when it has one, except HealthzPath. The span is
// named by the route that served it ("POST /v1/leases"), never by the
// raw path, which holds lease IDs. With tp nil it returns h itself.
//
// The sidecar build's own, for a lease API a sidecar rarely serves:
// otelhttp's handler links httpsnoop's 128 ResponseWriter wrappers and
// the semconv packages, ≈ 0.5 MB of every crawler pod's binary. It
// records the method, the route and the answer's status code, as
// otelhttp does under the same attribute names.
func Handler(h http.Handler, tp trace.TracerProvider, server string) http.Handler {
	if tp == nil {
		return h
	}
	tracer := tp.Tracer("github.com/proxyfleet/proxyfleet/internal/tracing")
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == HealthzPath {
			h.ServeHTTP(w, r)
			return
		}
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method+" "+server, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		r = r.WithContext(ctx)
		h.ServeHTTP(sw, r)
		// A ServeMux inside h sets the route on the request it was given.
		if r.Pattern != "" {
			span.SetName(r.Pattern)
			span.SetAttributes(attribute.String("http.route", r.Pattern))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		if sw.code >= 500 {
			span.SetStatus(codes.Error, "")
		}
	})
}

// statusWriter keeps the status code the handler answered with.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote && code >= 200 {
		s.code, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushes, deadlines).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
