package controller

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/rest"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// TestReconcileProxySpans runs a Managed Proxy to Running against the real
// API server with an in-memory exporter as the global tracer provider, and
// checks the trace: Reconcile Proxy spans for it, the provider's create
// and the Kubernetes requests (through the controller's client transport)
// as their children, no Kubernetes span without a parent, and the
// reconcile's log lines carrying the span's IDs.
func TestReconcileProxySpans(t *testing.T) {
	sr, tp := spanrec.Record(t)

	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(tracing.ParentOnlyTransport(tp))
	h := &harness{t: t, ns: env.Namespace(t), fake: providertest.New(), logs: &logRecorder{}}
	mgr, err := NewManager(cfg, ManagerOptions{ProxyNamespace: h.ns, MetricsAddr: "0", Logger: logr.New(&recordingSink{rec: h.logs})})
	if err != nil {
		t.Fatal(err)
	}
	h.client = &countingClient{Client: mgr.GetClient()}
	h.r = &ProxyReconciler{
		Client:             h.client,
		Providers:          map[string]providers.Provider{fakeName: providers.WithTracing(h.fake, fakeName)},
		Installation:       testInstallation,
		Intervals:          fastIntervals(),
		SkipNameValidation: true,
	}
	h.run(mgr)
	h.create(h.managed("traced"))
	h.waitRunning("traced")
	h.stopOnce()

	spans := sr.Ended()
	reconciles := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.Name() == SpanReconcileProxy && has(s, string(AttrNamespace), h.ns) && has(s, string(AttrName), "traced") {
			reconciles[s.SpanContext().SpanID()] = s
			if s.Parent().IsValid() {
				t.Errorf("a reconcile span has a parent: %v", s.Parent())
			}
		}
	}
	if len(reconciles) == 0 {
		t.Fatalf("no %q span for %s/traced among %d spans", SpanReconcileProxy, h.ns, len(spans))
	}
	var creates, kube int
	for _, s := range spans {
		_, underReconcile := reconciles[s.Parent().SpanID()]
		switch {
		case s.Name() == providers.SpanCreate && has(s, string(providers.AttrProvider), fakeName):
			if !underReconcile {
				t.Errorf("provider.create's parent %v is not a reconcile of the Proxy", s.Parent())
			}
			if !has(s, string(providers.AttrResult), providers.ResultOK) {
				t.Errorf("provider.create attributes %v, want result ok", s.Attributes())
			}
			creates++
		case s.SpanKind() == trace.SpanKindClient && strings.Contains(attrString(s, "url.full"), cfg.Host):
			if !s.Parent().IsValid() {
				t.Errorf("Kubernetes request span %q (%s) has no parent: background calls must not trace", s.Name(), attrString(s, "url.full"))
			}
			if underReconcile && strings.Contains(attrString(s, "url.full"), "/namespaces/"+h.ns+"/proxies/traced") {
				kube++
			}
		}
	}
	if creates != 1 {
		t.Errorf("%d provider.create spans, want 1", creates)
	}
	if kube == 0 {
		t.Error("no Kubernetes request span for the Proxy under a reconcile (the status write goes through the traced transport)")
	}
	found := false
	for _, line := range strings.Split(h.logs.dump(), "\n") {
		if strings.Contains(line, "instance created") {
			found = true
			if !strings.Contains(line, "traceID") || !strings.Contains(line, "spanID") {
				t.Errorf("reconcile log line without the span's IDs: %s", line)
			}
		}
	}
	if !found {
		t.Errorf("no 'instance created' line in the log:\n%s", h.logs.dump())
	}
}

func attrString(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func has(s sdktrace.ReadOnlySpan, key, value string) bool { return attrString(s, key) == value }
