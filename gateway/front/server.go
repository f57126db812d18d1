// Package front is the gateway's own HTTP/1.1 server for the proxy port
// (Server, below, says why it is not net/http's). It owns the client
// connection: reading heads, checking what the gateway would forward
// (header names are tokens), framing answers, keep-alive, draining, and
// guarding a request body so nothing reads a connection's buffers once
// they are reused. It knows nothing of pools, members or the gateway's
// answer reasons, and imports nothing of proxyfleet's but internal/.
package front

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/internal/bufpool"
	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/internal/rawio"
)

// Server is the gateway's own HTTP/1.1 server for client connections.
//
// It replaces net/http's Server on the proxy port because, measured under
// load on two cores, net/http's server side was the largest single cost of
// a proxied request: for every request it starts a background read on the
// connection (to notice a client that leaves), which parks and wakes a
// second goroutine and ends with a deadline in the past, and it sets up a
// cancellable context and a chunking response writer. A forward proxy needs
// none of that: this loop reads a request head with net/http's own parser
// (http.ReadRequest, so framing and validation stay net/http's), calls the
// gateway's handler on the connection's goroutine, and writes the answer
// through the connection's pooled bufio.Writer. The handler sees an
// ordinary http.ResponseWriter that also flushes and hijacks, so the
// request path is the same code it was under net/http.
//
// What it does not do, on purpose: HTTP/2 and TLS on the proxy port (a
// forward proxy speaks HTTP/1.1), and noticing a client that leaves while
// its request is with an upstream (the answer's write then fails and the
// lease ends as usual; RequestTimeout bounds the wait).
type Server struct {
	handler func(http.ResponseWriter, *http.Request)
	o       Options
	log     *slog.Logger

	// ctx is every request's context; it ends when Close forces the
	// remaining connections shut.
	ctx    context.Context
	cancel context.CancelFunc

	shutting atomic.Bool
	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*frontConn]struct{}

	readers bufpool.Readers
	writers bufpool.Writers
}

// Options shape a Server.
type Options struct {
	// MaxHeaderBytes bounds a request head (431 above it).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request head, and a drain of a
	// body the handler left unread.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout time.Duration
	// RejectHeader is header lines ("Name: value", CRLF between two, none
	// at the end) every answer the Server makes itself carries, so clients
	// tell them from the handler's; "" adds none.
	RejectHeader string
	// Rejected is told of every request the Server ended before the
	// handler saw it; nil tells nothing.
	Rejected func(r Rejection, start time.Time)
	// Logger gets panics; nil discards.
	Logger *slog.Logger
	// ConnContext, as net/http's Server's, derives a connection's context
	// (every request on it carries it) from the Server's; nil keeps the
	// Server's.
	ConnContext func(ctx context.Context, c net.Conn) context.Context
	// HTTP2, when set, is given a connection that starts with HTTP/2's
	// connection preface (PRI * HTTP/2.0: HTTP/2 with prior knowledge,
	// h2c), with the bytes read from it so far put back in read, and
	// reports whether it took the connection (the Server then forgets
	// it). nil, or false, answers 505 as to any other HTTP/2 request line.
	HTTP2 func(c net.Conn, read []byte) bool
}

// h2Preface is the head of HTTP/2's connection preface as the request
// parser reads it (its "SM" line follows).
const h2Preface = "PRI * HTTP/2.0\r\n\r\n"

// Rejection is why the Server ended a request before its handler saw it.
type Rejection int

// Rejections.
const (
	// Malformed: the head did not read (400, 431) or asked what the
	// Server does not do (417).
	Malformed Rejection = iota
	// Gone: the client closed the connection mid-head.
	Gone
	// Stalled: the head did not arrive within ReadHeaderTimeout.
	Stalled
)

// Connection states, as net/http keeps them: Shutdown closes idle
// connections at once and waits for active ones to finish their request.
const (
	connIdle int32 = iota
	connActive
)

const (
	// headSlack is what net/http lets a head exceed MaxHeaderBytes by (its
	// bufio slack), kept so the 431 boundary does not move.
	headSlack = 4096
	// maxDrain is how much of a request body the handler left unread is
	// discarded to keep the connection; a longer one closes it.
	maxDrain = 256 << 10
)

// New returns a Server that calls handler for every request, on the
// connection's own goroutine.
func New(handler func(http.ResponseWriter, *http.Request), o Options) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Rejected == nil {
		o.Rejected = func(Rejection, time.Time) {}
	}
	if o.RejectHeader != "" {
		o.RejectHeader += "\r\n"
	}
	return &Server{
		handler: handler,
		o:       o,
		log:     o.Logger,
		ctx:     ctx,
		cancel:  cancel,
		lns:     make(map[net.Listener]struct{}),
		conns:   make(map[*frontConn]struct{}),
	}
}

// Serve accepts on ln until Shutdown or Close; it returns
// http.ErrServerClosed then, as net/http's Serve does.
func (f *Server) Serve(ln net.Listener) error {
	f.mu.Lock()
	if f.shutting.Load() {
		f.mu.Unlock()
		_ = ln.Close()
		return http.ErrServerClosed
	}
	f.lns[ln] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.lns, ln)
		f.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if f.shutting.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAccept(err) {
				// Out of file descriptors and the like: back off and go
				// on, as net/http does, instead of giving up the port.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				f.log.Debug("accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		fc := f.newConn(c)
		if fc == nil {
			continue
		}
		go fc.serve()
	}
}

// ServeConn serves c, a connection accepted elsewhere (a client's side of
// a tunnel the gateway terminated), on the calling goroutine until it
// ends, as Serve serves the connections it accepts: Shutdown waits for
// its request and Close closes it. c is closed when ServeConn returns.
func (f *Server) ServeConn(c net.Conn) {
	if fc := f.newConn(c); fc != nil {
		fc.serve()
	}
}

// isTemporaryAccept reports accept errors worth retrying (EMFILE, ENFILE,
// ECONNABORTED...): anything but a closed listener.
func isTemporaryAccept(err error) bool {
	return !errors.Is(err, net.ErrClosed)
}

func (f *Server) newConn(c net.Conn) *frontConn {
	fc := &frontConn{f: f, c: c, remote: c.RemoteAddr().String(), ctx: f.ctx}
	if f.o.ConnContext != nil {
		fc.ctx = f.o.ConnContext(f.ctx, c)
	}
	fc.io = rawio.Wrap(c)
	fc.rec.R = fc.io
	fc.lr.R = &fc.rec
	f.mu.Lock()
	if f.shutting.Load() {
		f.mu.Unlock()
		_ = c.Close()
		return nil
	}
	f.conns[fc] = struct{}{}
	f.mu.Unlock()
	return fc
}

func (f *Server) forget(fc *frontConn) {
	f.mu.Lock()
	delete(f.conns, fc)
	f.mu.Unlock()
}

// Shutdown stops accepting, closes idle connections and waits for active
// ones to finish their request, until ctx ends (then ctx's error).
func (f *Server) Shutdown(ctx context.Context) error {
	f.stopAccepting()
	wait := time.Millisecond
	for {
		if f.closeIdle() == 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Close closes every listener and connection at once and ends the
// requests' context.
func (f *Server) Close() {
	f.stopAccepting()
	f.mu.Lock()
	for fc := range f.conns {
		_ = fc.c.Close()
	}
	f.mu.Unlock()
	f.cancel()
}

func (f *Server) stopAccepting() {
	f.mu.Lock()
	f.shutting.Store(true)
	for ln := range f.lns {
		_ = ln.Close()
	}
	f.mu.Unlock()
}

// closeIdle closes the idle connections and returns how many remain.
func (f *Server) closeIdle() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fc := range f.conns {
		if fc.state.CompareAndSwap(connIdle, connClosing) {
			_ = fc.c.Close()
		}
	}
	return len(f.conns)
}

// connClosing marks an idle connection Shutdown closed, so it does not
// turn active again.
const connClosing int32 = 2

// frontConn is one client connection.
type frontConn struct {
	f *Server
	c net.Conn
	// io is c for the request path's reads and writes (rawio: no runtime
	// system call per read or write); c stays c, a *net.TCPConn for a
	// tunnel to splice.
	io     net.Conn
	remote string
	state  atomic.Int32
	lr     keepalive.LimitReader // caps the request head; lifted for bodies
	// rec, under lr, sees each request head's bytes as the client sent
	// them, for the order and case of its fields (fieldorder).
	rec fieldorder.Recorder
	br  *bufio.Reader
	bw  *bufio.Writer
	w   frontWriter
	// ctx is every request's context on this connection.
	ctx context.Context
	// body is the current request's body, nil when it has none. A
	// Transport may still be reading it from another goroutine when the
	// handler returns; it is abandoned before the buffers are reused.
	body *guardBody
	// start is when the current request's head began to arrive.
	start time.Time
	// requests is how many requests the connection carried; handedOff,
	// that it went to Options.HTTP2.
	requests  int
	handedOff bool
}

func (fc *frontConn) serve() {
	f := fc.f
	fc.br = f.readers.Get(&fc.lr)
	fc.bw = f.writers.Get(fc.io)
	hijacked := false
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				f.log.Error("panic serving a proxy request", "remote", fc.remote, "panic", v, "stack", string(buf))
			}
			// Like net/http: what was written goes out, then the
			// connection closes, so the client sees a cut answer.
			if !fc.w.hijacked {
				_ = fc.bw.Flush()
			}
			hijacked = fc.w.hijacked
		}
		if !hijacked {
			_ = fc.c.Close()
			if fc.body != nil {
				// The close ends a read under way; after this nothing
				// reads fc.br.
				fc.body.abandon()
			}
			f.forget(fc)
			f.readers.Put(fc.br)
			f.writers.Put(fc.bw)
		}
	}()
	for {
		if !fc.state.CompareAndSwap(connActive, connIdle) && fc.state.Load() != connIdle {
			return // Shutdown closed it
		}
		if f.shutting.Load() {
			return
		}
		_ = fc.c.SetReadDeadline(time.Now().Add(f.o.IdleTimeout))
		fc.lr.N = int64(f.o.MaxHeaderBytes + headSlack)
		if _, err := fc.br.Peek(1); err != nil {
			return
		}
		if !fc.state.CompareAndSwap(connIdle, connActive) {
			return
		}
		req, order, body, ok := fc.readRequest()
		if !ok {
			if fc.handedOff {
				hijacked = true
				f.readers.Put(fc.br)
				f.writers.Put(fc.bw)
			}
			return
		}
		fc.requests++
		req.RemoteAddr = fc.remote
		if req.Method != http.MethodConnect {
			// Even a head without fields: what goes on adds none the
			// client did not write (net/http would add Content-Length: 0
			// to a POST).
			req = req.WithContext(fieldorder.NewContext(fc.ctx, order))
		} else {
			req = req.WithContext(fc.ctx)
		}
		w := &fc.w
		w.reset(fc, req)
		f.handler(w, req)
		if w.hijacked {
			// The handler is done with the ReadWriter Hijack gave it (its
			// contract, see frontWriter.Hijack): the buffers go back to the
			// pool instead of staying garbage behind every tunnel.
			hijacked = true
			f.readers.Put(fc.br)
			f.writers.Put(fc.bw)
			return
		}
		w.finishRequest()
		if w.closeAfter || req.Close {
			return
		}
		if req.Body != http.NoBody && !fc.drained(req.Body, body) {
			return
		}
	}
}

// readRequest reads the next request head and checks it, answering a
// head that does not read or check itself (the connection then ends). A
// body is guarded, and with Expect: 100-continue asks for itself on first
// read (body is then its expectBody). order is the head's fields as the
// client wrote them (none for a CONNECT, which is not sent on).
func (fc *frontConn) readRequest() (req *http.Request, order fieldorder.Order, body *expectBody, ok bool) {
	fc.start, fc.body = time.Now(), nil
	_ = fc.c.SetReadDeadline(fc.start.Add(fc.f.o.ReadHeaderTimeout))
	// The head starts with what the reader holds already (at least the
	// byte serve peeked at).
	buffered, _ := fc.br.Peek(fc.br.Buffered())
	fc.rec.Start(buffered)
	req, err := http.ReadRequest(fc.br)
	if err != nil || req.Method == http.MethodConnect {
		fc.rec.Abort()
	} else {
		order = fc.rec.Stop(fc.br.Buffered())
	}
	if err != nil {
		fc.badRequest(err)
		return
	}
	fc.lr.N = -1
	if req.ProtoMajor != 1 && fc.handOff(req, order) {
		return nil, order, nil, false
	}
	if req.ProtoMajor != 1 {
		// As net/http's server: http.ReadRequest reads any HTTP/x.y, and
		// an HTTP/2.0 or 3.7 request line sent on as HTTP/1.1 would be a
		// request the client did not make.
		fc.reject(http.StatusHTTPVersionNotSupported, "unsupported protocol version "+echo.Quote(req.Proto))
		return nil, order, nil, false
	}
	if msg := checkRequest(req); msg != "" {
		fc.reject(http.StatusBadRequest, msg)
		return nil, order, nil, false
	}
	if req.Body != http.NoBody {
		// A body may stream for as long as it takes (the request
		// deadline bounds a client that stalls before the answer).
		_ = fc.c.SetReadDeadline(time.Time{})
		if e := req.Header["Expect"]; len(e) > 0 {
			if !req.ProtoAtLeast(1, 1) || len(e) > 1 || !strings.EqualFold(e[0], "100-continue") {
				fc.reject(http.StatusExpectationFailed, "unsupported Expect header")
				return nil, order, nil, false
			}
			body = &expectBody{rc: req.Body, fc: fc}
			req.Body = body
		}
		fc.body = &guardBody{rc: req.Body}
		req.Body = fc.body
		if len(req.TransferEncoding) > 0 && req.Trailer == nil {
			// net/http's body puts trailers that were not announced into
			// the Trailer field of the request it was read for: a map made
			// now is shared with the handler's copy of the request, which
			// checks and forwards them.
			req.Trailer = http.Header{}
		}
		if len(req.TransferEncoding) > 0 {
			// A chunked request may also have carried a Content-Length,
			// which net/http's parser drops without a trace: RFC 9112
			// 6.1 has the connection end after the answer to such a
			// request, so no request another hop framed by the length
			// can follow on it. Chunked uploads are rare in crawls, so
			// every chunked request ends its connection.
			req.Close = true
		}
	}
	return req, order, body, true
}

// handOff gives the connection to Options.HTTP2 when req, its first, is
// the HTTP/2 preface's head (no fields): the preface's head and what the
// reader holds behind it are put back for the HTTP/2 server to read.
func (fc *frontConn) handOff(req *http.Request, order fieldorder.Order) bool {
	if fc.f.o.HTTP2 == nil || fc.requests > 0 || req.Method != "PRI" || req.RequestURI != "*" ||
		req.ProtoMajor != 2 || req.ProtoMinor != 0 || order.Len() != 0 {
		return false
	}
	buffered, _ := fc.br.Peek(fc.br.Buffered())
	read := append([]byte(h2Preface), buffered...)
	_ = fc.c.SetReadDeadline(time.Time{})
	fc.f.forget(fc)
	if !fc.f.o.HTTP2(fc.c, read) {
		return false
	}
	fc.handedOff = true
	return true
}

// checkRequest is what the front end checks beyond net/http's parser,
// before anything is leased or sent on: an HTTP/1.1 request names its host
// (http.ReadRequest has moved Host from the header into r.Host, or taken
// it from an absolute URI), and every header name is a token. The parser
// already refuses control characters in values, a second Content-Length or
// Host, and any Transfer-Encoding but a lone chunked; it accepts a name
// with a space in it or before its colon, which an upstream might read
// differently (a "Transfer-Encoding :" it frames by, or not).
func checkRequest(r *http.Request) string {
	if r.ProtoAtLeast(1, 1) && r.Host == "" && r.Method != http.MethodConnect {
		return "missing required Host header"
	}
	if !httpguts.ValidHostHeader(r.Host) {
		// As net/http's server: inside a MITM'd tunnel the Host header is
		// what the site is sent (a request there is in origin form).
		return "malformed Host header"
	}
	if name, ok := InvalidFieldName(r.Header); !ok {
		return "malformed header name " + echo.Quote(name) + ": a name is a token, with no space in it or before its colon"
	}
	return ""
}

// drained discards what is left of a request body the handler did not
// read (up to maxDrain, at the pace a request head is allowed) and reports
// whether the connection can go on. A 100-continue body never asked for is
// not read at all: the client has not sent it, so the connection closes.
func (fc *frontConn) drained(body io.ReadCloser, eb *expectBody) bool {
	if eb != nil && !eb.sent {
		return false
	}
	_ = fc.c.SetReadDeadline(time.Now().Add(fc.f.o.ReadHeaderTimeout))
	n, err := io.CopyN(io.Discard, body, maxDrain+1)
	return err == io.EOF && n <= maxDrain
}

// badRequest answers a head that could not be read, as net/http does: 431
// for one above MaxHeaderBytes, 400 with the parser's words otherwise,
// nothing for a client that went quiet or left.
func (fc *frontConn) badRequest(err error) {
	if fc.lr.N == 0 {
		fc.reject(http.StatusRequestHeaderFieldsTooLarge, "request head larger than "+strconv.Itoa(fc.f.o.MaxHeaderBytes)+" bytes")
		return
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		// A client that went quiet mid-head gets nothing, as from net/http.
		fc.f.o.Rejected(Stalled, fc.start)
		return
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, new(*net.OpError)):
		// Not any net.Error: a *url.Error is one too, and a malformed
		// request URI is a 400.
		fc.f.o.Rejected(Gone, fc.start)
		return
	}
	fc.reject(http.StatusBadRequest, err.Error())
}

// reject writes a plain-text error answer and the connection then closes.
func (fc *frontConn) reject(status int, msg string) {
	_, _ = fc.bw.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) +
		"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" + fc.f.o.RejectHeader + "\r\n" +
		strconv.Itoa(status) + " " + http.StatusText(status) + ": " + msg)
	_ = fc.bw.Flush()
	fc.f.o.Rejected(Malformed, fc.start)
}

// expectBody sends "100 Continue" when the handler first reads a body
// the client announced with Expect: 100-continue.
type expectBody struct {
	rc   io.ReadCloser
	fc   *frontConn
	sent bool
}

func (b *expectBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		if !b.fc.w.wroteHeader {
			_, _ = b.fc.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			if err := b.fc.bw.Flush(); err != nil {
				return 0, err
			}
		}
	}
	return b.rc.Read(p)
}

func (b *expectBody) Close() error { return b.rc.Close() }
