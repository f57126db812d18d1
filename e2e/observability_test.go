package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
)

// consoleSpan is a span as OpenTelemetry's console exporter writes it.
type consoleSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s consoleSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

// splitOutput checks that every line a process wrote is a JSON log record
// with an RFC 3339 time, or a span from the console exporter, and returns
// the records and the spans.
func splitOutput(t *testing.T, name, out string) (records []map[string]any, spans []consoleSpan) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("%s line %d is not JSON (%v): %q", name, i+1, err, line)
			continue
		}
		if _, isSpan := m["SpanContext"]; isSpan {
			var s consoleSpan
			if err := json.Unmarshal([]byte(line), &s); err != nil {
				t.Errorf("%s line %d: span: %v", name, i+1, err)
			}
			spans = append(spans, s)
			continue
		}
		ts, _ := m["time"].(string)
		if _, err := time.Parse(time.RFC3339, ts); err != nil {
			t.Errorf("%s line %d: time %q is not RFC 3339: %q", name, i+1, ts, line)
		}
		if m["msg"] == nil || m["level"] == nil {
			t.Errorf("%s line %d has no msg or level: %q", name, i+1, line)
		}
		records = append(records, m)
	}
	return records, spans
}

// TestJSONLogsAndConsoleTraces runs the controller (its lease API fed by
// an External Proxy on a real Squid) and two gateways — one leasing from
// the controller, one with its own pool and lease API — with --log-format
// json and the console trace exporter, sends requests through them and a
// lease request with a traceparent to both lease APIs, stops them, and
// checks that every line they wrote is JSON (log records with RFC 3339
// times, or spans) and that the spans are the ones promised.
func TestJSONLogsAndConsoleTraces(t *testing.T) {
	// The children inherit these (testutil passes our environment on).
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	squid := startSquids(t, "obs", "127.0.0.71")[0]
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})

	const apiToken = "e2e-observability-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, apiToken+"\n")
	ctl := startController(t, bin, env, ns, "--log-format", "json", "--lease-api-token-file", tokenFile, "--health-tick", "100ms")
	px := gen.Proxy("squid", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.1", int32(squid.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: site.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	waitProxy(t, env.Client, ns, "squid", "Ready and Healthy", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
	})
	remote := startGateway(t, bin, gwConfig{rotation: "per-request",
		args: poolAPIArgs(t, "http://"+ctl.leaseAPIAddr, apiToken, "--log-format", "json", "--log-level", "debug")})
	local := startGateway(t, bin, gwConfig{api: true, upstreams: []string{squid.URL()}, args: []string{"--log-format", "json", "--log-level", "debug"}})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	lease := func(addr, token string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/leases", strings.NewReader(`{"target":"site.example"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s/v1/leases: %d %s", addr, resp.StatusCode, body)
		}
	}
	lease(ctl.leaseAPIAddr, apiToken)
	lease(local.apiAddr, local.apiToken)
	for _, gw := range []*gatewayProc{remote, local} {
		c := gw.client(t, "", nil)
		resp, err := c.Get(site.URL() + "/through-the-gateway")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET through %s: %d", gw.addr, resp.StatusCode)
		}
		// A refusal, so warnings are among the lines too.
		req, _ := http.NewRequest("GET", site.URL()+"/refused", nil)
		req.Header.Set(hdrProxy, "no-such-member")
		if resp, err = c.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("GET pinned to no member through %s: %d, want 503", gw.addr, resp.StatusCode)
		}
	}
	for _, r := range site.Requests() {
		if v := r.Header.Get("Traceparent"); v != "" {
			t.Errorf("the site got traceparent %q on %s %s", v, r.Method, r.URI)
		}
	}

	// Stopping flushes the spans; then every line is there.
	procs := []struct {
		name string
		p    *testutil.Process
		// started are the addresses the gateway's start record must carry:
		// with JSON logs no usage block prints them.
		started map[string]string
	}{
		{"gateway (--lease-api)", remote.Process, map[string]string{"listen": remote.addr, "metricsListen": remote.metricsAddr}},
		{"gateway (own pool)", local.Process, map[string]string{"listen": local.addr, "metricsListen": local.metricsAddr, "apiListen": local.apiAddr}},
		{"controller", ctl.Process, nil},
	}
	spansOf := map[string][]consoleSpan{}
	for _, pr := range procs {
		if code, err := pr.p.Stop(); err != nil || code != 0 {
			t.Fatalf("%s: exit %d %v", pr.name, code, err)
		}
		records, spans := splitOutput(t, pr.name, pr.p.Output())
		if len(records) == 0 {
			t.Errorf("%s wrote no log records", pr.name)
		}
		spansOf[pr.name] = spans
		if pr.started == nil {
			continue
		}
		var start map[string]any
		for _, r := range records {
			if r["msg"] == "gateway started" {
				start = r
			}
		}
		for k, want := range pr.started {
			if start == nil || start[k] != want {
				t.Errorf("%s: start record %v: %s = %v, want %q", pr.name, start, k, start[k], want)
			}
		}
	}

	find := func(proc, name string, ok func(consoleSpan) bool) {
		t.Helper()
		var seen []string
		for _, s := range spansOf[proc] {
			if s.Name == name && ok(s) {
				return
			}
			seen = append(seen, s.Name)
		}
		t.Errorf("%s: no matching %q span among %v", proc, name, seen)
	}
	childOfCaller := func(s consoleSpan) bool { return s.Parent.TraceID == traceID && s.SpanContext.TraceID == traceID }
	find("controller", "POST /v1/leases", childOfCaller)
	find("gateway (own pool)", "POST /v1/leases", childOfCaller)
	find("controller", "Reconcile Proxy", func(s consoleSpan) bool {
		return s.attr("k8s.namespace.name") == ns && s.attr("proxyfleet.proxy") == "squid"
	})
	find("gateway (--lease-api)", "gateway.request", func(s consoleSpan) bool {
		return s.attr("proxyfleet.member") == ns+"/squid" && s.attr("proxyfleet.outcome") == "ok" &&
			s.attr("proxyfleet.target") == "127.0.0.1" && s.attr("proxyfleet.attempts") == "1"
	})
	find("gateway (own pool)", "gateway.request", func(s consoleSpan) bool {
		return s.attr("proxyfleet.outcome") == "no_member" && s.attr("proxyfleet.reason") == "no_member"
	})
}
