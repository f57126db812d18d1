package health

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// SpanHealthProbe names the span of one health probe through a Proxy.
const SpanHealthProbe = "health.probe"

// TraceProbes returns next with every probe also recorded as one span,
// health.probe, that ran for the probe's duration and ended when it was
// recorded. Probes are frequent (every Proxy, every interval), so the
// controller does this only with --trace-health-probes; with tp nil it
// returns next itself.
func TraceProbes(next ProbeMetrics, tp trace.TracerProvider) ProbeMetrics {
	if tp == nil {
		return next
	}
	return &probeTracer{next: next, tracer: tp.Tracer("github.com/proxyfleet/proxyfleet/controller/health")}
}

type probeTracer struct {
	next   ProbeMetrics
	tracer trace.Tracer
}

func (p *probeTracer) ObserveProbe(proxy string, d time.Duration, ok bool) {
	end := time.Now()
	_, span := p.tracer.Start(context.Background(), SpanHealthProbe, trace.WithTimestamp(end.Add(-d)),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("proxyfleet.proxy", proxy), attribute.Bool("proxyfleet.healthy", ok)))
	if !ok {
		span.SetStatus(codes.Error, "probe failed")
	}
	span.End(trace.WithTimestamp(end))
	if p.next != nil {
		p.next.ObserveProbe(proxy, d, ok)
	}
}

func (p *probeTracer) Forget(proxy string) {
	if p.next != nil {
		p.next.Forget(proxy)
	}
}
