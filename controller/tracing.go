package controller

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyfleet/proxyfleet/internal/logging"
)

// SpanReconcileProxy names the span of one Proxy reconcile; the provider
// calls and the Kubernetes requests it makes are its children.
const SpanReconcileProxy = "Reconcile Proxy"

// Attribute keys of the reconcile spans.
const (
	AttrNamespace = attribute.Key("k8s.namespace.name")
	AttrName      = attribute.Key("proxyfleet.proxy")
	AttrRequeue   = attribute.Key("proxyfleet.requeue_after")
)

// traced makes every reconcile of next one span named name (OpenTelemetry's
// global provider: a no-op without tracing). Inside a recording span the
// reconcile's logger carries the span's traceID and spanID, so its lines
// can be found from the trace and back.
func traced(name string, next reconcile.Reconciler) reconcile.Reconciler {
	return &tracedReconciler{name: name, next: next, tracer: otel.Tracer("github.com/proxyfleet/proxyfleet/controller")}
}

type tracedReconciler struct {
	name   string
	next   reconcile.Reconciler
	tracer trace.Tracer
}

func (t *tracedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ctx, span := t.tracer.Start(ctx, t.name, trace.WithAttributes(
		AttrNamespace.String(req.Namespace), AttrName.String(req.Name)))
	defer span.End()
	if span.IsRecording() {
		ctx = log.IntoContext(ctx, logging.WithSpan(ctx, log.FromContext(ctx)))
	}
	res, err := t.next.Reconcile(ctx, req)
	if res.RequeueAfter > 0 {
		span.SetAttributes(AttrRequeue.String(res.RequeueAfter.String()))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "reconcile failed")
	}
	return res, err
}
