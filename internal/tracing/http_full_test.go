//go:build !sidecar

package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestParentOnlyTransportWithoutAProviderIsTheTransport(t *testing.T) {
	var rt http.RoundTripper = countingRT{}
	if ParentOnlyTransport(nil)(rt) != rt {
		t.Error("ParentOnlyTransport(nil) wraps the transport")
	}
}

func TestParentOnlyTransportTracesOnlyUnderAParent(t *testing.T) {
	tp, sr := recorder(t)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("traceparent"))
		mu.Unlock()
	}))
	defer srv.Close()
	c := &http.Client{Transport: ParentOnlyTransport(tp)(http.DefaultTransport)}
	get := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/pods", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	get(context.Background())
	ctx, parent := tp.Tracer("t").Start(context.Background(), "Reconcile Proxy")
	get(ctx)
	parent.End()

	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("want the parent and one client span, got %v", names(spans))
	}
	client := spans[0]
	if client.SpanKind() != trace.SpanKindClient || client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span %q kind %v parent %v, want a client child of the reconcile", client.Name(), client.SpanKind(), client.Parent())
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != "" {
		t.Errorf("a request outside any span sent traceparent %q", seen[0])
	}
	if !strings.Contains(seen[1], parent.SpanContext().TraceID().String()) {
		t.Errorf("the request under a span sent traceparent %q, want its trace", seen[1])
	}
}

type countingRT struct{}

func (countingRT) RoundTrip(*http.Request) (*http.Response, error) { return nil, io.EOF }

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}
