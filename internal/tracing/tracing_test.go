package tracing

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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

// env is a Getenv over a fixed map.
func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestSetupWithoutAnExporterBuildsNothing(t *testing.T) {
	restoreGlobals(t)
	before := otel.GetTracerProvider()
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"nothing set", nil},
		{"exporter none", map[string]string{EnvTracesExporter: "none"}},
		{"none beats an endpoint", map[string]string{EnvTracesExporter: "none", EnvEndpoint: "http://127.0.0.1:4318"}},
		{"sdk disabled", map[string]string{EnvSDKDisabled: "true", EnvTracesExporter: "console"}},
		{"only unrelated OTEL variables", map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Setup(context.Background(), Options{Service: "test", Getenv: env(tc.env)})
			if err != nil {
				t.Fatal(err)
			}
			if tr.Enabled() || tr.TracerProvider() != nil {
				t.Fatalf("tracing is on with %v", tc.env)
			}
			if otel.GetTracerProvider() != before {
				t.Fatal("Setup replaced the global tracer provider")
			}
			// The global provider is still the no-op one: spans do not record
			// and carry no IDs, so loggers add no trace fields.
			_, span := otel.Tracer("t").Start(context.Background(), "s")
			if span.IsRecording() || span.SpanContext().IsValid() {
				t.Fatalf("a span from the global provider records: %+v", span.SpanContext())
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown of disabled tracing: %v", err)
			}
		})
	}
}

func TestSetupRefusesUnknownValuesNamingTheVariable(t *testing.T) {
	restoreGlobals(t)
	for _, tc := range []struct {
		env      map[string]string
		variable string
	}{
		{map[string]string{EnvTracesExporter: "jaeger"}, EnvTracesExporter},
		{map[string]string{EnvTracesExporter: "otlp", EnvProtocol: "http/json"}, EnvProtocol},
		{map[string]string{EnvTracesExporter: "otlp", EnvTracesProtocol: "thrift"}, EnvTracesProtocol},
	} {
		_, err := Setup(context.Background(), Options{Getenv: env(tc.env)})
		if err == nil || !strings.Contains(err.Error(), tc.variable) {
			t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.variable)
		}
	}
}

func TestExporterNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"an endpoint alone means otlp", map[string]string{EnvEndpoint: "http://127.0.0.1:4318"}, "otlp"},
		{"a traces endpoint alone means otlp", map[string]string{EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, "otlp"},
		{"console", map[string]string{EnvTracesExporter: "console"}, "console"},
		{"a list", map[string]string{EnvTracesExporter: "otlp, console"}, "otlp,console"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := exporterNames(env(tc.env))
			if err != nil || strings.Join(got, ",") != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestConsoleExporterWritesSpansAndShutdownFlushes(t *testing.T) {
	restoreGlobals(t)
	var out bytes.Buffer
	tr, err := Setup(context.Background(), Options{Service: "proxyfleet-test", Console: &out,
		Getenv: env(map[string]string{EnvTracesExporter: "console"})})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() || otel.GetTracerProvider() != tr.TracerProvider() {
		t.Fatal("console tracing is not the global provider")
	}
	if _, ok := otel.GetTextMapPropagator().(propagation.TraceContext); !ok {
		t.Fatalf("global propagator is %T, want the W3C trace context", otel.GetTextMapPropagator())
	}
	_, span := otel.Tracer("t").Start(context.Background(), "console-span")
	span.End()
	// Batched: nothing is promised before Shutdown, everything after it.
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Name":"console-span"`, `"Value":"proxyfleet-test"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console output lacks %s:\n%s", want, out.String())
		}
	}
}

func TestSamplerComesFromTheEnvironment(t *testing.T) {
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	tr, err := Setup(context.Background(), Options{Console: &bytes.Buffer{}, Getenv: env(map[string]string{EnvTracesExporter: "console"})})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	_, span := tr.TracerProvider().Tracer("t").Start(context.Background(), "s")
	defer span.End()
	if span.IsRecording() || span.SpanContext().IsSampled() {
		t.Fatal("OTEL_TRACES_SAMPLER=always_off was not applied")
	}
}

// recorder is an SDK provider that keeps every span, sampled always.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}
