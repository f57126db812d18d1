// Package tracing sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables, and holds the small pieces both commands wire
// with it: the lease API's server middleware and the Kubernetes client's
// transport. What a component records as spans is the component's own
// (the gateway's requests: gateway/daemon; health probes: controller/health;
// reconciles: controller; provider calls: providers), so this package
// imports nothing of ours and every component can import it.
//
// With no exporter configured nothing of the SDK is built: the global
// tracer provider stays OpenTelemetry's no-op one, every span started
// anywhere in the process is a non-recording no-op, no trace header is
// read or written, and log lines carry no trace fields.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The environment variables Setup reads itself. The exporters read their
// own (OTEL_EXPORTER_OTLP_*: endpoint, headers, timeout, TLS; see
// exporter_full.go and exporter_sidecar.go), the SDK
// reads OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG and the OTEL_BSP_*
// batch settings, and the resource reads OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES.
const (
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// Exporter names of OTEL_TRACES_EXPORTER.
const (
	ExporterNone    = "none"
	ExporterConsole = "console"
	ExporterOTLP    = "otlp"
)

// OTLP protocols of OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Options configure Setup.
type Options struct {
	// Service is service.name unless OTEL_SERVICE_NAME says otherwise.
	Service string
	// Console is where the console exporter writes (the process's stderr).
	Console io.Writer
	// Getenv reads the environment; nil is os.Getenv.
	Getenv func(string) string
	// Logger receives OpenTelemetry's own messages and export errors
	// (which it would otherwise print to stderr in a format of its own);
	// nil leaves them there.
	Logger *slog.Logger
}

// Tracing is the process's tracing: an SDK tracer provider installed as the
// global one, or nothing (Enabled false) when no exporter is configured.
type Tracing struct {
	tp        *sdktrace.TracerProvider
	exporters []string
}

// Setup reads the environment and, when it names an exporter, builds the
// SDK tracer provider, installs it and the W3C trace-context propagator as
// OpenTelemetry's globals, and returns it; Shutdown flushes it. An exporter
// is configured when OTEL_TRACES_EXPORTER lists console or otlp, or when it
// is unset and an OTLP endpoint variable is set (then otlp). Unset with no
// endpoint, "none", or OTEL_SDK_DISABLED=true configure none, and Setup
// returns a disabled Tracing without touching any global. An unknown
// exporter or protocol is an error naming the variable.
func Setup(ctx context.Context, o Options) (*Tracing, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	names, err := exporterNames(getenv)
	if err != nil || len(names) == 0 {
		return &Tracing{}, err
	}
	var opts []sdktrace.TracerProviderOption
	for _, name := range names {
		exp, err := newExporter(ctx, name, o.Console, getenv)
		if err != nil {
			return &Tracing{}, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	// Later detectors win: service.name from Options unless the environment
	// names one.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", o.Service)),
		resource.WithFromEnv())
	if err != nil {
		return &Tracing{}, fmt.Errorf("tracing resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	// No WithSampler: NewTracerProvider takes the sampler from
	// OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG itself, and defaults
	// to parentbased_always_on.
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	if o.Logger != nil {
		log := o.Logger
		// OpenTelemetry logs every tracer it creates at debug; keep its
		// warnings and errors only.
		otel.SetLogger(logr.FromSlogHandler(atLeast{Handler: log.Handler(), level: slog.LevelInfo}))
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: exporting spans failed", "err", err) }))
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &Tracing{tp: tp, exporters: names}, nil
}

// exporterNames are the exporters the environment asks for, none when
// tracing is off.
func exporterNames(getenv func(string) string) ([]string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return nil, nil
	}
	v := strings.TrimSpace(getenv(EnvTracesExporter))
	if v == "" {
		if getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != "" {
			return []string{ExporterOTLP}, nil
		}
		return nil, nil
	}
	var names []string
	for _, n := range strings.Split(v, ",") {
		switch n = strings.TrimSpace(n); n {
		case ExporterNone:
			return nil, nil
		case ExporterConsole, ExporterOTLP:
			names = append(names, n)
		default:
			return nil, fmt.Errorf("%s=%q: unknown exporter %q (want %s, %s or %s)", EnvTracesExporter, v, n, ExporterOTLP, ExporterConsole, ExporterNone)
		}
	}
	return names, nil
}

func newExporter(ctx context.Context, name string, console io.Writer, getenv func(string) string) (sdktrace.SpanExporter, error) {
	if name == ExporterConsole {
		if console == nil {
			console = os.Stderr
		}
		return stdouttrace.New(stdouttrace.WithWriter(console))
	}
	variable, proto := EnvTracesProtocol, strings.TrimSpace(getenv(EnvTracesProtocol))
	if proto == "" {
		variable, proto = EnvProtocol, strings.TrimSpace(getenv(EnvProtocol))
	}
	switch proto {
	case "", ProtocolHTTP:
		return newOTLPHTTP(ctx, getenv)
	case ProtocolGRPC:
		return newOTLPGRPC(ctx, variable)
	}
	return nil, fmt.Errorf("%s=%q: unsupported OTLP protocol (want %s or %s)", variable, proto, ProtocolHTTP, ProtocolGRPC)
}

// Enabled reports whether an exporter is configured.
func (t *Tracing) Enabled() bool { return t != nil && t.tp != nil }

// Exporters names the configured exporters, for the start-up log line.
func (t *Tracing) Exporters() []string {
	if t == nil {
		return nil
	}
	return t.exporters
}

// TracerProvider is the SDK provider, nil when tracing is off: callers on a
// hot path test for nil and do nothing else.
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if !t.Enabled() {
		return nil
	}
	return t.tp
}

// Shutdown exports the spans still buffered and stops the exporters,
// within ctx's deadline. It is a no-op when tracing is off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("flushing traces: %w", err)
	}
	return nil
}

// atLeast drops records below level, whatever the handler would take.
type atLeast struct {
	slog.Handler
	level slog.Level
}

func (a atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= a.level && a.Handler.Enabled(ctx, l)
}

func (a atLeast) WithAttrs(as []slog.Attr) slog.Handler {
	return atLeast{Handler: a.Handler.WithAttrs(as), level: a.level}
}

func (a atLeast) WithGroup(name string) slog.Handler {
	return atLeast{Handler: a.Handler.WithGroup(name), level: a.level}
}
