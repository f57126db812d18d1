package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// traceHeaders are the request headers of every common trace propagation
// format; none may reach a member or a site from the gateway.
var traceHeaders = []string{"Traceparent", "Tracestate", "Baggage", "B3", "X-B3-Traceid", "X-B3-Spanid",
	"X-B3-Sampled", "Uber-Trace-Id", "X-Cloud-Trace-Context", "Grpc-Trace-Bin", "X-Amzn-Trace-Id"}

// gatewaySpans runs one traced gateway in front of a real Squid ("squid")
// and a Target standing in as a member ("recorder", it records the heads
// the gateway sends its members), with OpenTelemetry's globals set the way
// Setup sets them, and returns the gateway's address.
func gatewaySpans(t *testing.T) (addr string, sr interface {
	Ended() []sdktrace.ReadOnlySpan
}, site, member *testutil.Target) {
	t.Helper()
	restoreGlobals(t)
	tp, rec := recorder(t)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	sq := squid.StartAll(t, squid.Options{Name: "trace"})[0]
	site = testutil.StartTarget(t, testutil.TargetOptions{})
	member = testutil.StartTarget(t, testutil.TargetOptions{})
	squidURL, _ := url.Parse(sq.URL())
	memberURL, _ := url.Parse(member.URL())
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{{Name: "squid", URL: squidURL}, {Name: "recorder", URL: memberURL}})
	g, err := gateway.New(gateway.Options{Pool: store, AllowPrivateTargets: true, Tracer: NewGatewayTracer(tp)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	return ln.Addr().String(), rec, site, member
}

func TestGatewayRequestSpansAndNoTraceHeaderUpstream(t *testing.T) {
	addr, sr, site, member := gatewaySpans(t)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr})}}
	get := func(path, pin string, want int) {
		t.Helper()
		req, _ := http.NewRequest("GET", site.URL()+path, nil)
		req.Header.Set(gateway.HeaderProxy, pin)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s through %s: %d, want %d", path, pin, resp.StatusCode, want)
		}
	}
	// A tunnel through the recorder; the client sends a traceparent of its
	// own on the CONNECT, which must neither parent the span nor travel on.
	connect := func() {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s: recorder\r\ntraceparent: %s\r\n\r\n", site.Addr(), site.Addr(), gateway.HeaderProxy, incomingTraceparent)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "CONNECT"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
	}
	get("/through-squid", "squid", 200)
	get("/through-recorder", "recorder", 200)
	connect()
	get("/no-such-member", "nope", http.StatusServiceUnavailable)

	var spans []sdktrace.ReadOnlySpan
	poll.Until(t, 30*time.Second, "four ended spans", func() error {
		if spans = sr.Ended(); len(spans) < 4 {
			return fmt.Errorf("%d spans: %v", len(spans), names(spans))
		}
		return nil
	})
	if len(spans) != 4 {
		t.Fatalf("want one span per request, got %v", names(spans))
	}
	// In the order the requests were made: a span ends after its answer
	// is written, so the client may already be on its next request.
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	target := site.Host()
	for i, want := range []struct {
		member, target, outcome string
		attempts                int64
		failed                  bool
	}{
		{"squid", target, fault.OutcomeOK, 1, false},
		{"recorder", target, fault.OutcomeOK, 1, false},
		{"recorder", target, fault.OutcomeOK, 1, false},
		{"", target, fault.ReasonNoMember, 0, true},
	} {
		s := spans[i]
		if s.Name() != SpanGatewayRequest {
			t.Errorf("span %d named %q", i, s.Name())
		}
		for key, v := range map[string]string{"proxyfleet.member": want.member, "proxyfleet.target": want.target, "proxyfleet.outcome": want.outcome} {
			if got, ok := attr(s, key); !ok || got.AsString() != v {
				t.Errorf("span %d: %s = %q (set %v), want %q", i, key, got.AsString(), ok, v)
			}
		}
		if got, _ := attr(s, "proxyfleet.attempts"); got.AsInt64() != want.attempts {
			t.Errorf("span %d: attempts %d, want %d", i, got.AsInt64(), want.attempts)
		}
		if failed := s.Status().Code == codes.Error; failed != want.failed {
			t.Errorf("span %d: status %v, want error %v", i, s.Status(), want.failed)
		}
		if s.Parent().IsValid() || s.SpanContext().TraceID().String() == incomingTraceID {
			t.Errorf("span %d has a parent %v: a client's trace header must not parent it", i, s.Parent())
		}
		if s.EndTime().Before(s.StartTime()) || s.StartTime().IsZero() {
			t.Errorf("span %d runs %v..%v", i, s.StartTime(), s.EndTime())
		}
	}
	if got, _ := attr(spans[3], "proxyfleet.reason"); got.AsString() != fault.ReasonNoMember {
		t.Errorf("failed request's reason %q, want %q", got.AsString(), fault.ReasonNoMember)
	}

	// What the site got through Squid, and what the recorder got as a
	// member (the absolute-URI GET and the CONNECT), carries no trace header.
	seen := map[string]bool{}
	for _, tg := range []*testutil.Target{site, member} {
		for _, r := range tg.Requests() {
			seen[r.Method+" "+r.URI] = true
			for _, h := range traceHeaders {
				if v := r.Header.Get(h); v != "" {
					t.Errorf("%s %s arrived with %s: %q", r.Method, r.URI, h, v)
				}
			}
		}
	}
	for _, want := range []string{"GET /through-squid", "GET " + site.URL() + "/through-recorder", "CONNECT " + site.Addr()} {
		if !seen[want] {
			t.Errorf("no %q was recorded (saw %v): the header check did not cover it", want, seen)
		}
	}
}

// TestNoTracerNoSpans pins the default: a gateway without a Tracer makes
// no span even with an SDK provider installed globally.
func TestNoTracerNoSpans(t *testing.T) {
	restoreGlobals(t)
	tp, sr := recorder(t)
	otel.SetTracerProvider(tp)
	site := testutil.StartTarget(t, testutil.TargetOptions{})
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{pool.DirectMember()})
	g, err := gateway.New(gateway.Options{Pool: store, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	defer g.Shutdown(context.Background())
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}}
	resp, err := client.Get(site.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := len(sr.Ended()); n != 0 || !strings.HasPrefix(resp.Status, "200") {
		t.Fatalf("%d spans, status %s; want none, 200", n, resp.Status)
	}
}

func TestNewGatewayTracerWithoutAProviderIsNil(t *testing.T) {
	if NewGatewayTracer(nil) != nil {
		t.Error("NewGatewayTracer(nil) is not nil: the gateway would do work per request")
	}
}

// incomingTraceparent is a caller's span: trace 4bf9..., span 00f0....
const (
	incomingTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpanID      = "00f067aa0ba902b7"
	incomingTraceparent = "00-" + incomingTraceID + "-" + incomingSpanID + "-01"
)

// restoreGlobals puts OpenTelemetry's globals back when the test ends.
func restoreGlobals(t *testing.T) {
	t.Helper()
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		if otel.GetTracerProvider() != tp {
			otel.SetTracerProvider(tp)
		}
		if otel.GetTextMapPropagator() != prop {
			otel.SetTextMapPropagator(prop)
		}
	})
}

// recorder is an SDK provider that keeps every span, sampled always.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

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
