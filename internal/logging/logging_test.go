package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// span is a context holding a valid (remote, sampled) span context.
func span(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

func decode(t *testing.T, line string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatalf("log line is not JSON: %v: %q", err, line)
	}
	return m
}

func TestJSONRecordsCarryRFC3339TimeAndSpanIDs(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, slog.LevelInfo, true)
	ctx, sc := span(t)
	l.InfoContext(ctx, "inside", "k", "v")
	l.Info("outside")
	l.With("a", 1).InfoContext(ctx, "derived")
	l.Debug("below the level")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines (debug dropped), got %d: %q", len(lines), buf.String())
	}
	for i, want := range []struct {
		msg     string
		spanIDs bool
	}{{"inside", true}, {"outside", false}, {"derived", true}} {
		m := decode(t, lines[i])
		if m["msg"] != want.msg {
			t.Errorf("line %d: msg %v, want %q", i, m["msg"], want.msg)
		}
		ts, _ := m["time"].(string)
		if _, err := time.Parse(time.RFC3339, ts); err != nil {
			t.Errorf("line %d: time %q is not RFC 3339: %v", i, ts, err)
		}
		_, hasTrace := m[KeyTraceID]
		if hasTrace != want.spanIDs {
			t.Errorf("line %d: traceID present %v, want %v: %s", i, hasTrace, want.spanIDs, lines[i])
		}
		if want.spanIDs && (m[KeyTraceID] != sc.TraceID().String() || m[KeySpanID] != sc.SpanID().String()) {
			t.Errorf("line %d: trace fields %v/%v, want %s/%s", i, m[KeyTraceID], m[KeySpanID], sc.TraceID(), sc.SpanID())
		}
	}
}

func TestTextRecordsWithoutSpanAreThePlainHandlers(t *testing.T) {
	var got, want bytes.Buffer
	New(&got, slog.LevelInfo, false).Info("hello", "k", "v")
	slog.New(slog.NewTextHandler(&want, nil)).Info("hello", "k", "v")
	// The times differ; everything after them must not.
	cut := func(s string) string { return s[strings.Index(s, " level="):] }
	if cut(got.String()) != cut(want.String()) {
		t.Fatalf("without a span the line changed:\n got %q\nwant %q", got.String(), want.String())
	}
}

func TestLogrAndWithSpan(t *testing.T) {
	var buf bytes.Buffer
	log := Logr(New(&buf, slog.LevelInfo, true))
	ctx, sc := span(t)
	WithSpan(ctx, log).Info("reconciled")
	WithSpan(context.Background(), log).Info("no span")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	if m := decode(t, lines[0]); m[KeyTraceID] != sc.TraceID().String() || m[KeySpanID] != sc.SpanID().String() {
		t.Errorf("logr line inside the span lacks its IDs: %s", lines[0])
	}
	if m := decode(t, lines[1]); m[KeyTraceID] != nil {
		t.Errorf("logr line outside a span has a traceID: %s", lines[1])
	}
}

func TestServerErrorLogWritesThroughTheLogger(t *testing.T) {
	var buf bytes.Buffer
	ServerErrorLog(New(&buf, slog.LevelInfo, true)).Printf("http: TLS handshake error from %s: EOF", "127.0.0.1:1")
	m := decode(t, strings.TrimSpace(buf.String()))
	if m["level"] != "WARN" || !strings.Contains(m["msg"].(string), "TLS handshake error") {
		t.Fatalf("ErrorLog line: %v", m)
	}
}
