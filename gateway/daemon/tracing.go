package daemon

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
)

// Attribute keys of the gateway's request spans.
const (
	AttrMember   = attribute.Key("proxyfleet.member")
	AttrTarget   = attribute.Key("proxyfleet.target")
	AttrOutcome  = attribute.Key("proxyfleet.outcome")
	AttrReason   = attribute.Key("proxyfleet.reason")
	AttrAttempts = attribute.Key("proxyfleet.attempts")
)

// SpanGatewayRequest names the span of one proxied request or tunnel.
const SpanGatewayRequest = "gateway.request"

// GatewayTracer turns each request the gateway ends into one span, from
// the request's arrival to its end, a root span sampled by the
// provider's sampler. It is a gateway.RequestTracer; NewGatewayTracer
// returns nil (no tracer at all) when tp is nil.
type GatewayTracer struct{ tracer trace.Tracer }

// NewGatewayTracer returns the gateway's request tracer on tp, or nil
// when tp is nil: the gateway then skips tracing with one nil check.
func NewGatewayTracer(tp trace.TracerProvider) gateway.RequestTracer {
	if tp == nil {
		return nil
	}
	return &GatewayTracer{tracer: tp.Tracer("github.com/proxyfleet/proxyfleet/gateway")}
}

// TraceRequest records t as a finished span. The span is started with
// the request's start time and a context without a parent, so a
// crawler's own trace headers never parent it and nothing is propagated
// anywhere.
func (g *GatewayTracer) TraceRequest(ctx context.Context, t gateway.RequestTrace) {
	_, span := g.tracer.Start(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), SpanGatewayRequest,
		trace.WithTimestamp(t.Start), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			AttrMember.String(t.Member),
			AttrTarget.String(t.Target),
			AttrOutcome.String(t.Outcome),
			AttrAttempts.Int(t.Attempts),
		))
	if t.Reason != "" {
		span.SetAttributes(AttrReason.String(t.Reason))
	}
	// Error only where the gateway could not serve (its own 5xx answers):
	// a client's bad request or token is not the gateway's failure.
	if t.Reason != "" && fault.AnswerStatus(t.Reason) >= 500 {
		span.SetStatus(codes.Error, t.Reason)
	}
	span.End()
}
