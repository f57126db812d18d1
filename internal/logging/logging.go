// Package logging builds the one process logger both commands use: text or
// JSON records on stderr, each record written inside a span carrying the
// span's traceID and spanID, and the adapters that route other loggers
// (logr for controller-runtime and klog, the standard library's log for
// http.Server.ErrorLog) into it, so every line a process writes has one
// format.
//
// It imports logr and OpenTelemetry's trace API (for span IDs) only,
// nothing of proxyfleet, so every package may use it.
package logging

import (
	"context"
	"io"
	"log"
	"log/slog"
	"sync"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
)

// Keys of the trace fields on a record written inside a span.
const (
	KeyTraceID = "traceID"
	KeySpanID  = "spanID"
)

// New builds the process logger: records at level and above go to w, as
// JSON objects one a line when json is set, else as logfmt text. "time"
// is RFC 3339 in local time with its offset ("Z" in UTC, as in a
// container): with nanoseconds in JSON (time.RFC3339Nano, trailing zeros
// dropped), with milliseconds in text — what slog's two handlers write. A
// record logged with a context that holds a valid
// span carries traceID and spanID; without a span the record is exactly
// what the plain handler writes.
func New(w io.Writer, level slog.Level, json bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if json {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(traceHandler{h})
}

// Logr is l as a logr.Logger, the interface controller-runtime and klog
// log through. logr calls carry no context, so a reconcile's span reaches
// its lines through WithSpan instead.
func Logr(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }

// WithSpan returns log with the traceID and spanID of the span in ctx,
// or log itself when ctx holds no valid span.
func WithSpan(ctx context.Context, log logr.Logger) logr.Logger {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return log
	}
	return log.WithValues(KeyTraceID, sc.TraceID().String(), KeySpanID, sc.SpanID().String())
}

// Install makes l the process default for slog and for the standard
// library's log package. Code that logs through either without being
// handed a logger — above all every http.Server whose ErrorLog is nil,
// such as controller-runtime's metrics and probe servers — then writes
// through l in l's format instead of a bare line on stderr.
func Install(l *slog.Logger) { slog.SetDefault(l) }

// ServerErrorLog is an http.Server ErrorLog that writes each message (a
// failed TLS handshake, an accept error, a handler panic) into l at warn.
func ServerErrorLog(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelWarn)
}

// Locked returns w with every Write under one mutex. The logger and the
// console trace exporter both write to stderr; a span is one Write of
// several kilobytes, more than a pipe writes atomically, so without a
// shared lock a log line could land inside it.
func Locked(w io.Writer) io.Writer {
	if l, ok := w.(*lockedWriter); ok {
		return l
	}
	return &lockedWriter{w: w}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// traceHandler adds the span's IDs to records logged with a context that
// holds a valid span. Without one it costs one context lookup.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String(KeyTraceID, sc.TraceID().String()), slog.String(KeySpanID, sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
