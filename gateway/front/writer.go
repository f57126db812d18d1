package front

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// frontWriter is the http.ResponseWriter of one request on a frontConn.
// It frames the answer as net/http does: the handler's Content-Length when
// it set one, else the whole body's length when it fits the first buffer,
// else chunked (HTTP/1.1) or until close (HTTP/1.0); no body for HEAD,
// 1xx, 204 and 304. Header keys prefixed with http.TrailerPrefix become
// trailers of a chunked answer.
type frontWriter struct {
	fc  *frontConn
	req *http.Request

	header      http.Header
	status      int
	wroteHeader bool
	committed   bool // the head is in fc.bw
	bodyAllowed bool
	chunked     bool
	length      int64 // Content-Length, -1 when none
	written     int64
	pending     []byte // body held back until the head is committed
	closeAfter  bool
	hijacked    bool
}

// pendingMax is how much body is held back so a short answer gets a
// Content-Length instead of chunks.
const pendingMax = 2 << 10

func (w *frontWriter) reset(fc *frontConn, req *http.Request) {
	h := w.header
	if h != nil {
		clear(h)
	}
	*w = frontWriter{fc: fc, req: req, header: h, length: -1, pending: w.pending[:0]}
}

// Header is the answer's header map, until WriteHeader. It is made on
// first use and kept for the connection's next answers; a CONNECT tunnel
// never needs one.
func (w *frontWriter) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header, 16)
	}
	return w.header
}

// WriteHeader sends 1xx answers at once and records the final status.
func (w *frontWriter) WriteHeader(code int) {
	if w.hijacked || w.wroteHeader {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.writeHead(code, false)
		_ = w.fc.bw.Flush()
		return
	}
	w.status, w.wroteHeader = code, true
	w.bodyAllowed = !(w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified)
	if v := w.header["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
			w.length = n
		}
	}
}

// Write sends body bytes; the first ones wait in pending so a short
// answer can carry its length.
func (w *frontWriter) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.bodyAllowed {
		return 0, http.ErrBodyNotAllowed
	}
	if w.length >= 0 && w.written+int64(len(p)) > w.length {
		return 0, http.ErrContentLength
	}
	if !w.committed {
		if len(w.pending)+len(p) <= pendingMax {
			w.pending = append(w.pending, p...)
			w.written += int64(len(p))
			return len(p), nil
		}
		w.commit(false)
	}
	w.written += int64(len(p))
	return w.body(p)
}

func (w *frontWriter) body(p []byte) (int, error) {
	bw := w.fc.bw
	if w.chunked {
		if len(p) == 0 {
			return 0, nil
		}
		var hx [16]byte
		_, _ = bw.Write(strconv.AppendInt(hx[:0], int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
		n, err := bw.Write(p)
		if err == nil {
			_, err = bw.WriteString("\r\n")
		}
		return n, err
	}
	return bw.Write(p)
}

// SetReadDeadline sets the client connection's read deadline, as
// http.ResponseController does for net/http's writers: the gateway cuts off
// a stalled request body with it.
func (w *frontWriter) SetReadDeadline(t time.Time) error { return w.fc.c.SetReadDeadline(t) }

// Flush sends what is written so far.
func (w *frontWriter) Flush() {
	if w.hijacked {
		return
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false)
	}
	_ = w.fc.bw.Flush()
}

// Hijack hands the connection to the handler: a CONNECT tunnel, or MITM.
// The reader may hold bytes the client sent behind its request head. The
// ReadWriter is the connection's own pooled pair and is valid only until
// the handler returns: a handler that needs buffered bytes later copies
// them (serveConnect and serveMITM do).
func (w *frontWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.wroteHeader && !w.committed {
		w.commit(false)
	}
	if err := w.fc.bw.Flush(); err != nil {
		return nil, nil, err
	}
	w.hijacked = true
	fc := w.fc
	fc.f.forget(fc)
	return fc.c, bufio.NewReadWriter(fc.br, fc.bw), nil
}

// finishRequest ends the answer after the handler returned.
func (w *frontWriter) finishRequest() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true)
	}
	bw := w.fc.bw
	if w.chunked {
		_, _ = bw.WriteString("0\r\n")
		for k, vv := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vv {
					writeField(bw, name, v)
				}
			}
		}
		_, _ = bw.WriteString("\r\n")
	}
	if w.bodyAllowed && w.length >= 0 && w.written < w.length {
		w.closeAfter = true // short body: the client sees the connection end
	}
	if err := bw.Flush(); err != nil {
		w.closeAfter = true
	}
}

// commit writes the head (and the body held back) into the connection's
// buffer, choosing the framing. final is true when the handler is done,
// so the whole body is in pending.
func (w *frontWriter) commit(final bool) {
	w.committed = true
	switch {
	case !w.bodyAllowed, w.length >= 0:
	case final:
		w.length = int64(len(w.pending))
		w.Header()["Content-Length"] = []string{strconv.Itoa(len(w.pending))}
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
	default:
		w.closeAfter = true // HTTP/1.0 without a length: until close
	}
	w.writeHead(w.status, true)
	if len(w.pending) > 0 {
		_, _ = w.body(w.pending)
		w.pending = w.pending[:0]
	}
}

// writeHead writes a status line and the header map.
func (w *frontWriter) writeHead(code int, final bool) {
	bw := w.fc.bw
	_, _ = bw.WriteString(statusLine(code))
	if final {
		if w.req.Close || w.fc.f.shutting.Load() || HasToken(w.header["Connection"], "close") {
			w.closeAfter = true
		}
		delete(w.header, "Connection")
		delete(w.header, "Transfer-Encoding")
		switch {
		case w.closeAfter:
			_, _ = bw.WriteString("Connection: close\r\n")
		case !w.req.ProtoAtLeast(1, 1):
			// An HTTP/1.0 client asked to keep the connection (else
			// req.Close): say it is kept.
			_, _ = bw.WriteString("Connection: keep-alive\r\n")
		}
		if w.chunked {
			_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
		}
		if _, ok := w.header["Date"]; !ok {
			_, _ = bw.WriteString("Date: ")
			_, _ = bw.WriteString(httpDate())
			_, _ = bw.WriteString("\r\n")
		}
	}
	for k, vv := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, v := range vv {
			writeField(bw, k, v)
		}
	}
	_, _ = bw.WriteString("\r\n")
}

// writeField writes "name: value\r\n" with CR and LF in value turned into
// spaces, so no value can split the head (net/http does the same).
func writeField(bw *bufio.Writer, name, value string) {
	_, _ = bw.WriteString(name)
	_, _ = bw.WriteString(": ")
	if strings.ContainsAny(value, "\r\n") {
		value = strings.NewReplacer("\r", " ", "\n", " ").Replace(value)
	}
	_, _ = bw.WriteString(value)
	_, _ = bw.WriteString("\r\n")
}

// statusLines are the common status lines, built once.
var statusLines = func() map[int]string {
	m := make(map[int]string)
	for code := 100; code < 600; code++ {
		if t := http.StatusText(code); t != "" {
			m[code] = "HTTP/1.1 " + strconv.Itoa(code) + " " + t + "\r\n"
		}
	}
	return m
}()

func statusLine(code int) string {
	if s, ok := statusLines[code]; ok {
		return s
	}
	return "HTTP/1.1 " + strconv.Itoa(code) + " status code " + strconv.Itoa(code) + "\r\n"
}

// dateCache holds the Date header value of the current second: formatting
// it on every answer would cost more than the rest of the head.
var dateCache atomic.Pointer[cachedDate]

type cachedDate struct {
	sec int64
	s   string
}

func httpDate() string {
	now := time.Now()
	sec := now.Unix()
	if d := dateCache.Load(); d != nil && d.sec == sec {
		return d.s
	}
	d := &cachedDate{sec: sec, s: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.s
}
