package tracing

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/poolapi"
)

// incomingTraceparent is a caller's span: trace 4bf9..., span 00f0....
const (
	incomingTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpanID      = "00f067aa0ba902b7"
	incomingTraceparent = "00-" + incomingTraceID + "-" + incomingSpanID + "-01"
)

func TestLeaseAPIRequestIsOneServerSpanParentedOnTraceparent(t *testing.T) {
	tp, sr := recorder(t)
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{pool.DirectMember()})
	srv := httptest.NewServer(Handler(poolapi.NewAPIServer(store, poolapi.APIOptions{}), tp, "leaseapi"))
	defer srv.Close()

	do := func(method, path, body string, hdr map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
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
		t.Fatalf("want 2 spans (/healthz has none), got %d: %v", len(spans), names(spans))
	}
	lease, list := spans[0], spans[1]
	if lease.Name() != "POST /v1/leases" || list.Name() != "GET /v1/proxies" {
		t.Fatalf("span names %v, want the routes", names(spans))
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
	if v, ok := attr(lease, "http.response.status_code"); !ok || v.AsInt64() != http.StatusCreated {
		t.Errorf("status attribute %v %v, want 201", v, ok)
	}
}

func TestTraceProbesRecordsTheProbeAndPassesItOn(t *testing.T) {
	tp, sr := recorder(t)
	next := &countingProbes{}
	rec := TraceProbes(next, tp)
	rec.ObserveProbe("ns/px", 250*time.Millisecond, false)
	rec.Forget("ns/px")
	if next.observed != 1 || next.forgotten != 1 {
		t.Fatalf("next saw %d probes, %d forgets; want 1, 1", next.observed, next.forgotten)
	}
	spans := sr.Ended()
	if len(spans) != 1 || spans[0].Name() != SpanHealthProbe {
		t.Fatalf("spans %v, want one %s", names(spans), SpanHealthProbe)
	}
	s := spans[0]
	if d := s.EndTime().Sub(s.StartTime()); d != 250*time.Millisecond {
		t.Errorf("span lasts %v, want the probe's 250ms", d)
	}
	if v, _ := attr(s, "proxyfleet.proxy"); v.AsString() != "ns/px" {
		t.Errorf("proxy attribute %q", v.AsString())
	}
	if v, ok := attr(s, "proxyfleet.healthy"); !ok || v.AsBool() {
		t.Errorf("healthy attribute %v %v, want false", v, ok)
	}
}

type countingProbes struct{ observed, forgotten int }

func (c *countingProbes) ObserveProbe(string, time.Duration, bool) { c.observed++ }
func (c *countingProbes) Forget(string)                            { c.forgotten++ }

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
