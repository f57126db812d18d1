package providerhealth

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/providers"
)

// SpanCheck names the span of one provider's health check; the backend's
// calls (libvirt RPCs, Compute API requests, Kubernetes requests) are its
// children.
const SpanCheck = "providerhealth.check"

// TracedCheckers wraps each checker so every Check is one SpanCheck span
// with the provider's name and how many of its targets are ready
// (OpenTelemetry's global provider: a no-op without tracing).
func TracedCheckers(cs map[string]providers.Checker) map[string]providers.Checker {
	tracer := otel.Tracer("github.com/proxyfleet/proxyfleet/controller/providerhealth")
	out := make(map[string]providers.Checker, len(cs))
	for name, c := range cs {
		out[name] = tracedChecker{name: name, next: c, tracer: tracer}
	}
	return out
}

type tracedChecker struct {
	name   string
	next   providers.Checker
	tracer trace.Tracer
}

func (t tracedChecker) Check(ctx context.Context) []providers.TargetStatus {
	ctx, span := t.tracer.Start(ctx, SpanCheck, trace.WithAttributes(providers.AttrProvider.String(t.name)))
	defer span.End()
	ts := t.next.Check(ctx)
	ready := 0
	for _, s := range ts {
		if s.Ready {
			ready++
		}
	}
	span.SetAttributes(attribute.Int("proxyfleet.targets", len(ts)), attribute.Int("proxyfleet.targets_ready", ready))
	if ready < len(ts) {
		span.SetStatus(codes.Error, "a target is not ready")
	}
	return ts
}
