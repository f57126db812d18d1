package tracing

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP receiver that decodes every request with the
// generated OTLP types, so the hand-written encoding is checked against
// the real schema.
type collector struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	headers  []http.Header
	status   []int // answers to give, in order; then 200
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.headers = append(c.headers, r.Header.Clone())
	if len(c.status) > 0 {
		code := c.status[0]
		c.status = c.status[1:]
		w.WriteHeader(code)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, _ := io.ReadAll(body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(raw, req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c.requests = append(c.requests, req)
}

func (c *collector) got() ([]*coltracepb.ExportTraceServiceRequest, []http.Header) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, c.headers
}

func TestOTLPHTTPExporterSendsWhatTheSchemaReads(t *testing.T) {
	for _, compression := range []string{"", "gzip"} {
		t.Run("compression="+compression, func(t *testing.T) {
			col := &collector{}
			srv := httptest.NewServer(col)
			defer srv.Close()
			exp, err := newOTLPHTTPExporter(env(map[string]string{
				EnvEndpoint:                  srv.URL + "/",
				"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc, x-tenant=t1",
				"OTEL_EXPORTER_OTLP_TRACES_" + envCompression: compression,
			}))
			if err != nil {
				t.Fatal(err)
			}
			res := resource.NewSchemaless(attribute.String("service.name", "proxyfleet-test"))
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res),
				sdktrace.WithSampler(sdktrace.AlwaysSample()))
			parent := trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
				SpanID:  trace.SpanID{1, 1, 1, 1, 1, 1, 1, 1}, TraceFlags: trace.FlagsSampled, Remote: true})
			start := time.Unix(1700000000, 123)
			_, span := tp.Tracer("github.com/proxyfleet/test", trace.WithInstrumentationVersion("v1")).Start(
				trace.ContextWithRemoteSpanContext(context.Background(), parent), "gateway.request",
				trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.String("proxyfleet.member", "m1"), attribute.Int("proxyfleet.attempts", 2), attribute.Bool("b", false),
					attribute.Float64("f", 1.5), attribute.StringSlice("s", []string{"x", ""})))
			span.AddEvent("retry", trace.WithTimestamp(start.Add(time.Millisecond)), trace.WithAttributes(attribute.Int("n", 0)))
			span.SetStatus(codes.Error, "no member")
			span.End(trace.WithTimestamp(start.Add(time.Second)))
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}

			reqs, headers := col.got()
			if len(reqs) != 1 {
				t.Fatalf("%d export requests, want 1", len(reqs))
			}
			if h := headers[0]; h.Get("Authorization") != "Bearer abc" || h.Get("X-Tenant") != "t1" {
				t.Errorf("headers %v, want OTEL_EXPORTER_OTLP_HEADERS decoded", h)
			}
			rs := reqs[0].GetResourceSpans()
			if len(rs) != 1 || len(rs[0].GetScopeSpans()) != 1 || len(rs[0].GetScopeSpans()[0].GetSpans()) != 1 {
				t.Fatalf("request %v, want one resource, scope and span", reqs[0])
			}
			if got := attrs(rs[0].GetResource().GetAttributes()); got["service.name"] != "proxyfleet-test" {
				t.Errorf("resource %v", got)
			}
			scope := rs[0].GetScopeSpans()[0].GetScope()
			if scope.GetName() != "github.com/proxyfleet/test" || scope.GetVersion() != "v1" {
				t.Errorf("scope %v", scope)
			}
			s := rs[0].GetScopeSpans()[0].GetSpans()[0]
			sc := span.SpanContext()
			if hex.EncodeToString(s.GetTraceId()) != sc.TraceID().String() || hex.EncodeToString(s.GetSpanId()) != sc.SpanID().String() ||
				hex.EncodeToString(s.GetParentSpanId()) != parent.SpanID().String() {
				t.Errorf("ids %x %x %x, want %s %s %s", s.GetTraceId(), s.GetSpanId(), s.GetParentSpanId(), sc.TraceID(), sc.SpanID(), parent.SpanID())
			}
			if s.GetName() != "gateway.request" || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER ||
				s.GetStartTimeUnixNano() != uint64(start.UnixNano()) || s.GetEndTimeUnixNano() != uint64(start.Add(time.Second).UnixNano()) {
				t.Errorf("span %v", s)
			}
			if s.GetFlags() != 0x301 {
				t.Errorf("flags %#x, want sampled with a remote parent (0x301)", s.GetFlags())
			}
			want := map[string]string{"proxyfleet.member": "m1", "proxyfleet.attempts": "2", "b": "false", "f": "1.5", "s": "[x ]"}
			if got := attrs(s.GetAttributes()); !equalMaps(got, want) {
				t.Errorf("attributes %v, want %v", got, want)
			}
			if ev := s.GetEvents(); len(ev) != 1 || ev[0].GetName() != "retry" || attrs(ev[0].GetAttributes())["n"] != "0" ||
				ev[0].GetTimeUnixNano() != uint64(start.Add(time.Millisecond).UnixNano()) {
				t.Errorf("events %v", ev)
			}
			if st := s.GetStatus(); st.GetCode() != tracepb.Status_STATUS_CODE_ERROR || st.GetMessage() != "no member" {
				t.Errorf("status %v", st)
			}
		})
	}
}

// attrs renders OTLP attributes as text, typed values included.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	var render func(v *commonpb.AnyValue) string
	render = func(v *commonpb.AnyValue) string {
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return x.StringValue
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			if x.BoolValue {
				return "true"
			}
			return "false"
		case *commonpb.AnyValue_DoubleValue:
			return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		case *commonpb.AnyValue_ArrayValue:
			var parts []string
			for _, e := range x.ArrayValue.GetValues() {
				parts = append(parts, render(e))
			}
			return "[" + strings.Join(parts, " ") + "]"
		}
		return "?"
	}
	for _, kv := range kvs {
		m[kv.GetKey()] = render(kv.GetValue())
	}
	return m
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestOTLPHTTPExporterTriesAgainOnUnavailable(t *testing.T) {
	col := &collector{status: []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	exp, err := newOTLPHTTPExporter(env(map[string]string{EnvTracesEndpoint: srv.URL + "/v1/traces"}))
	if err != nil {
		t.Fatal(err)
	}
	exp.retryBase = time.Millisecond
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	span.End()
	_ = tp.Shutdown(context.Background())
	if reqs, headers := col.got(); len(reqs) != 1 || len(headers) != 3 {
		t.Fatalf("%d spans arrived in %d requests, want 1 after two refusals", len(reqs), len(headers))
	}

	// A refusal the specification does not retry is one attempt and an error.
	col = &collector{status: []int{http.StatusBadRequest}}
	srv2 := httptest.NewServer(col)
	defer srv2.Close()
	exp, _ = newOTLPHTTPExporter(env(map[string]string{EnvTracesEndpoint: srv2.URL + "/v1/traces"}))
	tp = sdktrace.NewTracerProvider()
	_, span = tp.Tracer("t").Start(context.Background(), "s")
	span.End()
	ro := span.(sdktrace.ReadOnlySpan)
	if err := exp.ExportSpans(context.Background(), []sdktrace.ReadOnlySpan{ro}); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("export answered 400: %v, want an error naming it", err)
	}
	if _, headers := col.got(); len(headers) != 1 {
		t.Fatalf("%d attempts on a 400, want 1", len(headers))
	}
}

func TestOTLPHTTPExporterRefusesBadVariablesNamingThem(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		variable string
	}{
		{map[string]string{EnvEndpoint: "collector:4318"}, EnvEndpoint},
		{map[string]string{EnvTracesEndpoint: "ftp://c/v1/traces"}, EnvTracesEndpoint},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "secret-without-equals"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"},
	} {
		_, err := newOTLPHTTPExporter(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.variable) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.variable)
		}
		if err != nil && strings.Contains(err.Error(), "secret-without-equals") {
			t.Errorf("the error shows the header value: %v", err)
		}
	}
	exp, err := newOTLPHTTPExporter(env(nil))
	if err != nil || exp.url != "http://localhost:4318/v1/traces" {
		t.Fatalf("defaults: %v, %v; want http://localhost:4318/v1/traces", exp, err)
	}
}
