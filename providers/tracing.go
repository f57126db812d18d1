package providers

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names of the provider calls WithTracing records.
const (
	SpanCreate = "provider." + OpCreate
	SpanGet    = "provider." + OpGet
	SpanDelete = "provider." + OpDelete
	SpanList   = "provider." + OpList
)

// Attribute keys of the provider spans.
const (
	AttrProvider   = attribute.Key("proxyfleet.provider")
	AttrProviderID = attribute.Key("proxyfleet.provider_id")
	AttrInstance   = attribute.Key("proxyfleet.instance")
	AttrResult     = attribute.Key("proxyfleet.result")
	AttrInstances  = attribute.Key("proxyfleet.instances")
)

// WithTracing wraps p so every Create, Get, Delete and ListByTag is one
// span (provider.create, provider.get, provider.delete, provider.list)
// with the entry name and the call's result (ResultLabel); the backend's
// own spans (libvirt RPCs, Compute API requests, Kubernetes requests) are
// its children. It is meant outermost, around WithMetrics, so the span
// covers everything the call does. Spans go to OpenTelemetry's global
// tracer provider: without tracing set up they are no-ops. Like
// WithMetrics it implements Checker exactly when p does, passing Check
// through.
func WithTracing(p Provider, name string) Provider {
	t := &tracingProvider{next: p, name: name, tracer: otel.Tracer("github.com/proxyfleet/proxyfleet/providers")}
	if c, ok := p.(Checker); ok {
		return &tracingChecker{tracingProvider: t, checker: c}
	}
	return t
}

type tracingProvider struct {
	next   Provider
	name   string
	tracer trace.Tracer
}

func (t *tracingProvider) start(ctx context.Context, span string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, span, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, AttrProvider.String(t.name))...))
}

// end records err's result; not_found is an answer (an instance that is
// gone), not a failure of the call.
func end(span trace.Span, err error) {
	result := ResultLabel(err)
	span.SetAttributes(AttrResult.String(result))
	if err != nil && result != ResultNotFound {
		span.RecordError(err)
		span.SetStatus(codes.Error, result)
	}
	span.End()
}

func (t *tracingProvider) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	ctx, span := t.start(ctx, SpanCreate, AttrInstance.String(req.Name))
	inst, err := t.next.Create(ctx, req)
	if err == nil {
		span.SetAttributes(AttrProviderID.String(inst.ProviderID))
	}
	end(span, err)
	return inst, err
}

func (t *tracingProvider) Get(ctx context.Context, providerID string) (Instance, error) {
	ctx, span := t.start(ctx, SpanGet, AttrProviderID.String(providerID))
	inst, err := t.next.Get(ctx, providerID)
	end(span, err)
	return inst, err
}

func (t *tracingProvider) Delete(ctx context.Context, providerID string) error {
	ctx, span := t.start(ctx, SpanDelete, AttrProviderID.String(providerID))
	err := t.next.Delete(ctx, providerID)
	end(span, err)
	return err
}

func (t *tracingProvider) ListByTag(ctx context.Context) ([]Instance, error) {
	ctx, span := t.start(ctx, SpanList)
	list, err := t.next.ListByTag(ctx)
	span.SetAttributes(AttrInstances.Int(len(list)))
	end(span, err)
	return list, err
}

func (t *tracingProvider) Unwrap() Provider { return t.next }

type tracingChecker struct {
	*tracingProvider
	checker Checker
}

func (t *tracingChecker) Check(ctx context.Context) []TargetStatus { return t.checker.Check(ctx) }
