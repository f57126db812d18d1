package providerhealth

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

func TestTracedCheckersMakeOneSpanPerCheck(t *testing.T) {
	sr, _ := spanrec.Record(t)
	// up starts a span of its own, as a backend's client would, to show
	// the context it is given carries the check's span.
	up := providertest.NewChecker(providers.TargetStatus{Target: "api", Ready: true})
	up.OnCheck(func(ctx context.Context) {
		_, s := otel.Tracer("backend").Start(ctx, "backend.call")
		s.End()
	})
	cs := TracedCheckers(map[string]providers.Checker{
		"up":   up,
		"half": providertest.NewChecker(providers.TargetStatus{Target: "a", Ready: true}, providers.TargetStatus{Target: "b", Ready: false}),
	})
	for name, want := range map[string]int{"up": 1, "half": 2} {
		if got := cs[name].Check(context.Background()); len(got) != want {
			t.Fatalf("%s: %d targets, want %d: the wrapper must pass the verdicts on", name, len(got), want)
		}
	}

	checks := map[string]sdktrace.ReadOnlySpan{}
	var backend sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case SpanCheck:
			for _, kv := range s.Attributes() {
				if kv.Key == providers.AttrProvider {
					checks[kv.Value.AsString()] = s
				}
			}
		case "backend.call":
			backend = s
		}
	}
	if len(checks) != 2 {
		t.Fatalf("check spans by provider %v, want up and half", checks)
	}
	if backend == nil || backend.Parent().SpanID() != checks["up"].SpanContext().SpanID() {
		t.Error("the backend's span is not a child of its check")
	}
	if checks["up"].Status().Code == codes.Error || checks["half"].Status().Code != codes.Error {
		t.Errorf("statuses up=%v half=%v, want ok and error (a target not ready)", checks["up"].Status(), checks["half"].Status())
	}
}
