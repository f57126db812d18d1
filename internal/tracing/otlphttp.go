package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// The OTLP exporter variables the sidecar's own exporter reads; each
// OTEL_EXPORTER_OTLP_TRACES_* one wins over its OTEL_EXPORTER_OTLP_* one.
const (
	envHeaders     = "HEADERS"
	envTimeout     = "TIMEOUT"
	envCompression = "COMPRESSION"
	envCertificate = "CERTIFICATE"
	envClientCert  = "CLIENT_CERTIFICATE"
	envClientKey   = "CLIENT_KEY"
)

// defaultOTLPEndpoint is the specification's default for OTLP over HTTP.
const defaultOTLPEndpoint = "http://localhost:4318"

// otlpHTTPExporter sends spans as OTLP/HTTP with binary protobuf bodies
// (POST .../v1/traces, Content-Type application/x-protobuf). It is what the
// sidecar build exports with: go.opentelemetry.io's otlptracehttp links
// gRPC and the generated OTLP protobuf packages (≈ 1.5 MiB of an idle
// sidecar's RSS and 2.7 MB of its binary), while the message it sends is
// a handful of nested types written here with protowire. It is not a
// general exporter: no retry queue (a failed batch is one error to the
// SDK's handler, after at most three attempts within the timeout), no
// partial-success parsing.
type otlpHTTPExporter struct {
	url         string
	headers     http.Header
	timeout     time.Duration
	gzip        bool
	client      *http.Client
	stopOnce    sync.Once
	stopped     chan struct{}
	retryBase   time.Duration
	maxAttempts int
}

// newOTLPHTTPExporter reads the OTLP exporter variables through getenv as
// the specification says: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or
// OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318) with
// /v1/traces appended; _HEADERS (k=v,... percent-encoded), _TIMEOUT
// (milliseconds, default 10000), _COMPRESSION (gzip or none),
// _CERTIFICATE (CA file), _CLIENT_CERTIFICATE and _CLIENT_KEY.
func newOTLPHTTPExporter(getenv func(string) string) (*otlpHTTPExporter, error) {
	get := func(suffix string) (name, value string) {
		name = "OTEL_EXPORTER_OTLP_TRACES_" + suffix
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return name, v
		}
		name = "OTEL_EXPORTER_OTLP_" + suffix
		return name, strings.TrimSpace(getenv(name))
	}
	endpoint := strings.TrimSpace(getenv(EnvTracesEndpoint))
	variable := EnvTracesEndpoint
	if endpoint == "" {
		variable = EnvEndpoint
		base := strings.TrimSpace(getenv(EnvEndpoint))
		if base == "" {
			base = defaultOTLPEndpoint
		}
		endpoint = strings.TrimSuffix(base, "/") + "/v1/traces"
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: want an http:// or https:// URL", variable)
	}
	e := &otlpHTTPExporter{url: endpoint, headers: http.Header{}, timeout: 10 * time.Second,
		stopped: make(chan struct{}), retryBase: time.Second, maxAttempts: 3}
	if name, v := get(envHeaders); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			k, errK := url.PathUnescape(strings.TrimSpace(k))
			val, errV := url.PathUnescape(strings.TrimSpace(val))
			if !ok || k == "" || errK != nil || errV != nil {
				// Never the value: headers carry credentials.
				return nil, fmt.Errorf("%s: want key=value,... (percent-encoded)", name)
			}
			e.headers.Add(k, val)
		}
	}
	if name, v := get(envTimeout); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return nil, fmt.Errorf("%s=%q: want milliseconds above 0", name, v)
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch name, v := get(envCompression); v {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, fmt.Errorf("%s=%q: want gzip or none", name, v)
	}
	tlsConf, err := otlpTLSConfig(get)
	if err != nil {
		return nil, err
	}
	e.client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tlsConf,
		MaxIdleConns: 1, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: e.timeout}}
	return e, nil
}

// otlpTLSConfig is the TLS configuration the _CERTIFICATE, _CLIENT_*
// variables ask for, nil when they are unset (the system roots).
func otlpTLSConfig(get func(string) (string, string)) (*tls.Config, error) {
	caName, caFile := get(envCertificate)
	certName, certFile := get(envClientCert)
	keyName, keyFile := get(envClientKey)
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caName, err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s=%s: no PEM certificate in it", caName, caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%s and %s go together", certName, keyName)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", certName, keyName, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// ExportSpans sends spans in one request, trying again (at most
// maxAttempts in all, within the timeout) when the collector is
// unreachable or answers 429, 502, 503 or 504, as the specification asks.
func (e *otlpHTTPExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	select {
	case <-e.stopped:
		return errors.New("otlp exporter is shut down")
	default:
	}
	body := encodeExportRequest(spans)
	encoding := ""
	if e.gzip {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body, encoding = zb.Bytes(), "gzip"
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	var last error
	for attempt := 0; attempt < e.maxAttempts; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(e.retryBase << (attempt - 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("otlp export to %s: %w (last: %v)", e.url, ctx.Err(), last)
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header = e.headers.Clone()
		req.Header.Set("Content-Type", "application/x-protobuf")
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		resp, err := e.client.Do(req)
		if err != nil {
			last = err
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		switch {
		case resp.StatusCode/100 == 2:
			return nil
		case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
			resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
			last = fmt.Errorf("answer %s", resp.Status)
			continue
		}
		return fmt.Errorf("otlp export to %s: answer %s (%d bytes of body)", e.url, resp.Status, len(msg))
	}
	return fmt.Errorf("otlp export to %s: %v after %d attempts", e.url, last, e.maxAttempts)
}

// Shutdown makes later exports fail and closes the idle connection.
func (e *otlpHTTPExporter) Shutdown(context.Context) error {
	e.stopOnce.Do(func() {
		close(e.stopped)
		e.client.CloseIdleConnections()
	})
	return nil
}

// Field numbers of opentelemetry/proto/collector/trace/v1 and the
// messages it holds (trace/v1, resource/v1, common/v1).
const (
	fExportResourceSpans = 1 // ExportTraceServiceRequest.resource_spans

	fResourceSpansResource   = 1
	fResourceSpansScopeSpans = 2
	fResourceSpansSchemaURL  = 3

	fResourceAttributes = 1

	fScopeSpansScope     = 1
	fScopeSpansSpans     = 2
	fScopeSpansSchemaURL = 3

	fScopeName    = 1
	fScopeVersion = 2

	fSpanTraceID       = 1
	fSpanSpanID        = 2
	fSpanTraceState    = 3
	fSpanParentSpanID  = 4
	fSpanName          = 5
	fSpanKind          = 6
	fSpanStart         = 7
	fSpanEnd           = 8
	fSpanAttributes    = 9
	fSpanDroppedAttrs  = 10
	fSpanEvents        = 11
	fSpanDroppedEvents = 12
	fSpanLinks         = 13
	fSpanDroppedLinks  = 14
	fSpanStatus        = 15
	fSpanFlags         = 16

	fEventTime       = 1
	fEventName       = 2
	fEventAttributes = 3
	fEventDropped    = 4

	fLinkTraceID    = 1
	fLinkSpanID     = 2
	fLinkTraceState = 3
	fLinkAttributes = 4
	fLinkDropped    = 5
	fLinkFlags      = 6

	fStatusMessage = 2
	fStatusCode    = 3

	fKeyValueKey   = 1
	fKeyValueValue = 2

	fAnyString = 1
	fAnyBool   = 2
	fAnyInt    = 3
	fAnyDouble = 4
	fAnyArray  = 5

	fArrayValues = 1
)

// Span flags of OTLP: the W3C trace flags in the low byte, then whether
// the parent's remoteness is known and whether it is remote.
const (
	spanFlagsHasIsRemote = 0x100
	spanFlagsIsRemote    = 0x200
)

// OTLP status codes (not OpenTelemetry Go's codes.Code numbering).
const (
	otlpStatusOK    = 1
	otlpStatusError = 2
)

// encodeExportRequest is an ExportTraceServiceRequest holding spans,
// grouped by resource and then by instrumentation scope, in the order
// each first appears.
func encodeExportRequest(spans []sdktrace.ReadOnlySpan) []byte {
	type scopeGroup struct {
		scope instrumentation.Scope
		spans []sdktrace.ReadOnlySpan
	}
	type resourceGroup struct {
		res    *resource.Resource
		scopes []*scopeGroup
	}
	var groups []*resourceGroup
	for _, s := range spans {
		var rg *resourceGroup
		for _, g := range groups {
			if g.res == s.Resource() || g.res.Equal(s.Resource()) {
				rg = g
				break
			}
		}
		if rg == nil {
			rg = &resourceGroup{res: s.Resource()}
			groups = append(groups, rg)
		}
		var sg *scopeGroup
		for _, g := range rg.scopes {
			if g.scope.Name == s.InstrumentationScope().Name && g.scope.Version == s.InstrumentationScope().Version &&
				g.scope.SchemaURL == s.InstrumentationScope().SchemaURL {
				sg = g
				break
			}
		}
		if sg == nil {
			sg = &scopeGroup{scope: s.InstrumentationScope()}
			rg.scopes = append(rg.scopes, sg)
		}
		sg.spans = append(sg.spans, s)
	}
	var out []byte
	for _, rg := range groups {
		var rs []byte
		if rg.res != nil {
			rs = appendMessage(rs, fResourceSpansResource, appendAttributes(nil, fResourceAttributes, rg.res.Attributes()))
		}
		for _, sg := range rg.scopes {
			var scope []byte
			scope = appendString(scope, fScopeName, sg.scope.Name)
			scope = appendString(scope, fScopeVersion, sg.scope.Version)
			ss := appendMessage(nil, fScopeSpansScope, scope)
			for _, s := range sg.spans {
				ss = appendMessage(ss, fScopeSpansSpans, encodeSpan(s))
			}
			ss = appendString(ss, fScopeSpansSchemaURL, sg.scope.SchemaURL)
			rs = appendMessage(rs, fResourceSpansScopeSpans, ss)
		}
		if rg.res != nil {
			rs = appendString(rs, fResourceSpansSchemaURL, rg.res.SchemaURL())
		}
		out = appendMessage(out, fExportResourceSpans, rs)
	}
	return out
}

func encodeSpan(s sdktrace.ReadOnlySpan) []byte {
	sc, parent := s.SpanContext(), s.Parent()
	var b []byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	b = appendString(b, fSpanTraceState, sc.TraceState().String())
	if parent.SpanID().IsValid() {
		pid := parent.SpanID()
		b = appendBytes(b, fSpanParentSpanID, pid[:])
	}
	b = appendString(b, fSpanName, s.Name())
	if k := s.SpanKind(); k != trace.SpanKindUnspecified {
		// trace.SpanKind numbers the kinds as OTLP's SpanKind does.
		b = appendVarint(b, fSpanKind, uint64(k))
	}
	b = appendFixed64(b, fSpanStart, unixNano(s.StartTime()))
	b = appendFixed64(b, fSpanEnd, unixNano(s.EndTime()))
	b = appendAttributes(b, fSpanAttributes, s.Attributes())
	b = appendVarint(b, fSpanDroppedAttrs, uint64(s.DroppedAttributes()))
	for _, ev := range s.Events() {
		var e []byte
		e = appendFixed64(e, fEventTime, unixNano(ev.Time))
		e = appendString(e, fEventName, ev.Name)
		e = appendAttributes(e, fEventAttributes, ev.Attributes)
		e = appendVarint(e, fEventDropped, uint64(ev.DroppedAttributeCount))
		b = appendMessage(b, fSpanEvents, e)
	}
	b = appendVarint(b, fSpanDroppedEvents, uint64(s.DroppedEvents()))
	for _, l := range s.Links() {
		var m []byte
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		m = appendBytes(m, fLinkTraceID, ltid[:])
		m = appendBytes(m, fLinkSpanID, lsid[:])
		m = appendString(m, fLinkTraceState, l.SpanContext.TraceState().String())
		m = appendAttributes(m, fLinkAttributes, l.Attributes)
		m = appendVarint(m, fLinkDropped, uint64(l.DroppedAttributeCount))
		m = appendFixed32(m, fLinkFlags, spanFlags(l.SpanContext)|uint32(l.SpanContext.TraceFlags()))
		b = appendMessage(b, fSpanLinks, m)
	}
	b = appendVarint(b, fSpanDroppedLinks, uint64(s.DroppedLinks()))
	var st []byte
	switch s.Status().Code {
	case codes.Ok:
		st = appendVarint(st, fStatusCode, otlpStatusOK)
	case codes.Error:
		st = appendString(st, fStatusMessage, s.Status().Description)
		st = appendVarint(st, fStatusCode, otlpStatusError)
	}
	b = appendMessage(b, fSpanStatus, st)
	return appendFixed32(b, fSpanFlags, spanFlags(parent)|uint32(sc.TraceFlags()))
}

// spanFlags says whether sc (a span's parent, or a link) is remote; the
// caller adds the trace flags (the span's own, or the link's).
func spanFlags(sc trace.SpanContext) uint32 {
	f := uint32(spanFlagsHasIsRemote)
	if sc.IsRemote() {
		f |= spanFlagsIsRemote
	}
	return f
}

func appendAttributes(b []byte, num protowire.Number, kvs []attribute.KeyValue) []byte {
	for _, kv := range kvs {
		if !kv.Valid() {
			continue
		}
		m := appendString(nil, fKeyValueKey, string(kv.Key))
		m = appendMessage(m, fKeyValueValue, encodeValue(kv.Value))
		b = appendMessage(b, num, m)
	}
	return b
}

// encodeValue is an AnyValue; slices become an ArrayValue.
func encodeValue(v attribute.Value) []byte {
	var b []byte
	array := func(n int, one func(i int) []byte) []byte {
		var arr []byte
		for i := range n {
			arr = appendMessage(arr, fArrayValues, one(i))
		}
		return appendMessage(b, fAnyArray, arr)
	}
	switch v.Type() {
	case attribute.BOOL:
		return appendBool(b, fAnyBool, v.AsBool())
	case attribute.INT64:
		return appendInt64(b, fAnyInt, v.AsInt64())
	case attribute.FLOAT64:
		return appendDouble(b, fAnyDouble, v.AsFloat64())
	case attribute.STRING:
		return appendStringAlways(b, fAnyString, v.AsString())
	case attribute.BOOLSLICE:
		s := v.AsBoolSlice()
		return array(len(s), func(i int) []byte { return appendBool(nil, fAnyBool, s[i]) })
	case attribute.INT64SLICE:
		s := v.AsInt64Slice()
		return array(len(s), func(i int) []byte { return appendInt64(nil, fAnyInt, s[i]) })
	case attribute.FLOAT64SLICE:
		s := v.AsFloat64Slice()
		return array(len(s), func(i int) []byte { return appendDouble(nil, fAnyDouble, s[i]) })
	case attribute.STRINGSLICE:
		s := v.AsStringSlice()
		return array(len(s), func(i int) []byte { return appendStringAlways(nil, fAnyString, s[i]) })
	}
	return appendStringAlways(b, fAnyString, v.String())
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

// The append helpers leave out a field holding its zero value, as proto3
// encoders do, except the *Always ones and messages (an empty message
// still says which oneof member or which status is set).

func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return appendMessage(b, num, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendStringAlways(b, num, s)
}

func appendStringAlways(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

// The oneof members of AnyValue are written even when zero: the field's
// presence is the value's type.

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeBool(v))
}

func appendInt64(b []byte, num protowire.Number, v int64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}
