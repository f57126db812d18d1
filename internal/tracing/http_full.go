//go:build !sidecar

package tracing

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Handler gives every request to h one server span, parented on the
// request's traceparent when it has one, except HealthzPath. The span is
// named by the route that served it ("POST /v1/leases"), never by the
// raw path, which holds lease IDs. With tp nil it returns h itself.
func Handler(h http.Handler, tp trace.TracerProvider, server string) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, server,
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path != HealthzPath }),
		otelhttp.WithSpanNameFormatter(func(operation string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return r.Method + " " + operation
		}))
}

// ParentOnlyTransport wraps rt so a request whose context holds a valid
// span gets a client span (and a traceparent to the server) and every
// other request passes through as it is: the Kubernetes client's calls
// show up inside a reconcile's trace, while informers' lists and watches,
// leader election and other background calls make no root spans of their
// own. With tp nil it returns rt itself. Its signature is client-go's
// transport.WrapperFunc (rest.Config.Wrap).
func ParentOnlyTransport(tp trace.TracerProvider) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		if tp == nil {
			return rt
		}
		return &parentOnly{plain: rt, traced: otelhttp.NewTransport(rt,
			otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))}
	}
}

type parentOnly struct{ plain, traced http.RoundTripper }

func (p *parentOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		return p.traced.RoundTrip(r)
	}
	return p.plain.RoundTrip(r)
}

// WrappedRoundTripper lets client-go find the transport underneath (it
// walks wrappers to cancel requests and to read TLS settings).
func (p *parentOnly) WrappedRoundTripper() http.RoundTripper { return p.plain }
