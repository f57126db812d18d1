package leaseapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/internal/tracing"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// incomingTraceparent is a caller's span: trace 4bf9..., span 00f0....
const (
	incomingTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpanID      = "00f067aa0ba902b7"
	incomingTraceparent = "00-" + incomingTraceID + "-" + incomingSpanID + "-01"
)

// The lease API served through tracing.Handler, as the gateway's run and
// the controller's lease API serve it: its spans are named by its routes.
func TestLeaseAPIRequestIsOneServerSpanParentedOnTraceparent(t *testing.T) {
	sr, tp := spanrec.Provider(t)
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{pool.DirectMember()})
	srv := httptest.NewServer(tracing.Handler(leaseapi.NewAPIServer(store, leaseapi.APIOptions{}), tp, "leaseapi"))
	defer srv.Close()

	do := func(method, path, body string, hdr map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := do("GET", "/healthz", "", nil); st != 200 {
		t.Fatalf("/healthz: %d", st)
	}
	if st := do("POST", "/v1/leases", `{"target":"example.com"}`, map[string]string{"traceparent": incomingTraceparent, "Content-Type": "application/json"}); st != http.StatusCreated {
		t.Fatalf("POST /v1/leases: %d", st)
	}
	if st := do("GET", "/v1/proxies", "", nil); st != 200 {
		t.Fatalf("GET /v1/proxies: %d", st)
	}

	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("want 2 spans (/healthz has none), got %d: %v", len(spans), spanrec.Names(spans))
	}
	lease, list := spans[0], spans[1]
	if lease.Name() != "POST /v1/leases" || list.Name() != "GET /v1/proxies" {
		t.Fatalf("span names %v, want the routes", spanrec.Names(spans))
	}
	if lease.SpanKind() != trace.SpanKindServer {
		t.Errorf("kind %v, want server", lease.SpanKind())
	}
	if got := lease.Parent(); got.TraceID().String() != incomingTraceID || got.SpanID().String() != incomingSpanID || !got.IsRemote() {
		t.Errorf("POST span's parent %v, want the incoming traceparent's span", got)
	}
	if lease.SpanContext().TraceID().String() != incomingTraceID {
		t.Errorf("POST span is in trace %s, want the caller's %s", lease.SpanContext().TraceID(), incomingTraceID)
	}
	if list.Parent().IsValid() {
		t.Errorf("a request without traceparent got a parent: %v", list.Parent())
	}
	if v, ok := spanrec.Attr(lease, "http.response.status_code"); !ok || v.AsInt64() != http.StatusCreated {
		t.Errorf("status attribute %v %v, want 201", v, ok)
	}
}
