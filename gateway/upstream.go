package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// The lean forwarding path: a plain-HTTP request without a body, for an
// http:// URL, through an http:// upstream proxy (the common case of a
// crawler behind Squid) is written and answered on the handler's own
// goroutine over a pooled keep-alive connection. net/http's Transport runs
// two goroutines per connection and hands every request and answer between
// them and the caller; on a busy two-core box those hand-offs cost more
// CPU than the proxying itself. Everything else (request bodies, https://
// URLs, TLS or SOCKS upstreams, direct members) keeps using the Transport.

const (
	// maxResponseHead bounds an upstream's answer head (1xx heads
	// included), as Transport.MaxResponseHeaderBytes did.
	maxResponseHead = 1 << 20
	// upBufSize is the read and write buffer of one upstream connection.
	upBufSize = 4 << 10
)

// aLongTimeAgo is a deadline in the past: setting it aborts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

var (
	errHeadTooLarge   = errors.New("upstream answer head larger than 1 MiB")
	errSwitched       = errors.New("upstream answered 101 Switching Protocols to a request that asked for no upgrade")
	errUpstreamClosed = errors.New("upstream closed the keep-alive connection before answering")
)

// upstreamPool keeps idle keep-alive connections to one http:// upstream.
type upstreamPool struct {
	addr        string
	dialTimeout time.Duration
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   []*upConn // oldest first; reuse takes the newest
	closed bool
	sweep  *time.Timer // closes connections idle longer than idleTimeout
}

// upConn is one connection to the upstream with its buffers.
type upConn struct {
	c      net.Conn
	lr     limitReader
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time
}

// limitReader caps how much may be read from the connection while an
// answer head is being parsed; it is lifted for the body.
type limitReader struct {
	c net.Conn
	n int64
}

func (r *limitReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	n, err := r.c.Read(p)
	r.n -= int64(n)
	return n, err
}

func newUpstreamPool(addr string, dialTimeout time.Duration) *upstreamPool {
	return &upstreamPool{addr: addr, dialTimeout: dialTimeout, maxIdle: maxIdlePerHost, idleTimeout: idleConnTimeout}
}

// get returns the newest idle connection, nil when none. A connection the
// upstream closed, or sent unasked bytes on, is dropped (see idleUnusable).
func (p *upstreamPool) get() *upConn {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if time.Since(pc.idleAt) >= p.idleTimeout || idleUnusable(pc.c) {
			_ = pc.c.Close()
			continue
		}
		return pc
	}
}

// put returns a connection whose last answer was read completely.
func (p *upstreamPool) put(pc *upConn) {
	pc.idleAt = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.maxIdle {
		p.mu.Unlock()
		_ = pc.c.Close()
		return
	}
	p.idle = append(p.idle, pc)
	if p.sweep == nil {
		p.sweep = time.AfterFunc(p.idleTimeout, p.sweepIdle)
	}
	p.mu.Unlock()
}

// sweepIdle closes connections idle for idleTimeout and re-arms itself
// while any remain, so an unused member does not hold sockets forever.
func (p *upstreamPool) sweepIdle() {
	now := time.Now()
	var expired []*upConn
	p.mu.Lock()
	i := 0
	for i < len(p.idle) && now.Sub(p.idle[i].idleAt) >= p.idleTimeout {
		i++
	}
	expired = append(expired, p.idle[:i]...)
	p.idle = append(p.idle[:0], p.idle[i:]...)
	if len(p.idle) > 0 {
		p.sweep.Reset(p.idleTimeout - now.Sub(p.idle[0].idleAt))
	} else {
		p.sweep = nil
	}
	p.mu.Unlock()
	for _, pc := range expired {
		_ = pc.c.Close()
	}
}

// closeIdle closes every idle connection; with final, connections handed
// back later are closed too (the member is gone or replaced).
func (p *upstreamPool) closeIdle(final bool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	if final {
		p.closed = true
	}
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	p.mu.Unlock()
	for _, pc := range idle {
		_ = pc.c.Close()
	}
}

func (p *upstreamPool) dial(ctx context.Context) (*upConn, error) {
	d := net.Dialer{Timeout: p.dialTimeout}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	pc := &upConn{c: c, lr: limitReader{c: c}}
	pc.br = bufio.NewReaderSize(&pc.lr, upBufSize)
	pc.bw = bufio.NewWriterSize(c, upBufSize)
	return pc, nil
}

// leanEligible reports whether req can take the lean path through mc.
func leanEligible(mc *memberConn, req *http.Request) bool {
	return mc.lean != nil && req.Body == nil && req.URL.Scheme == "http"
}

// replayable mirrors net/http's rule for resending a request on a fresh
// connection after a kept-alive one turned out to be closed: the methods
// rotation.Retryable allows (the lean path carries no body), or any request
// with an idempotency key, since the upstream never saw it.
func replayable(req *http.Request) bool {
	if req.Method == "" || rotation.Retryable(req.Method, false) {
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// roundTrip sends req (absolute URI, no body) to the upstream and returns
// its final answer; the answer's body hands the connection back to the
// pool once read to the end. ctx aborts the exchange, body included.
// A kept-alive connection that turns out closed is replaced by a fresh one
// when the request may be resent.
func (p *upstreamPool) roundTrip(ctx context.Context, req *http.Request, proxyAuth string) (*http.Response, error) {
	if proxyAuth != "" {
		// Only for this member: a retry may go through another one.
		req.Header["Proxy-Authorization"] = []string{proxyAuth}
		defer delete(req.Header, "Proxy-Authorization")
	}
	again := replayable(req)
	for {
		pc := p.get()
		reused := pc != nil
		if !reused {
			var err error
			if pc, err = p.dial(ctx); err != nil {
				return nil, err
			}
		}
		resp, stale, err := p.exchange(ctx, pc, req)
		if err == nil {
			return resp, nil
		}
		_ = pc.c.Close()
		if !reused || !stale || !again || ctx.Err() != nil {
			return nil, err
		}
		// The upstream dropped an idle connection; its siblings are
		// likely gone too (a restart), so start over with fresh ones.
		p.closeIdle(false)
	}
}

// exchange writes req on pc and reads the answer head. stale means the
// connection ended before a single byte of an answer arrived.
func (p *upstreamPool) exchange(ctx context.Context, pc *upConn, req *http.Request) (resp *http.Response, stale bool, err error) {
	c := pc.c
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err = req.WriteProxy(pc.bw); err == nil {
		err = pc.bw.Flush()
	}
	if err != nil {
		return nil, true, err
	}
	pc.lr.n = maxResponseHead
	if _, err = pc.br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			err = errUpstreamClosed
		}
		return nil, true, err
	}
	for {
		resp, err = http.ReadResponse(pc.br, req)
		if err != nil {
			return nil, false, err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, false, errSwitched
		}
		if resp.StatusCode >= 200 {
			break
		}
		// 1xx interim answers are not passed on, as with net/http's Transport.
	}
	pc.lr.n = math.MaxInt64
	resp.Body = &upBody{rc: resp.Body, pc: pc, pool: p, stop: stop, reuse: !resp.Close}
	return resp, false, nil
}

// upBody is an answer body on the lean path: read to its end, it hands the
// connection back; closed early or broken, it closes the connection.
type upBody struct {
	rc    io.ReadCloser
	pc    *upConn
	pool  *upstreamPool
	stop  func() bool
	reuse bool
	done  bool
	err   error
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		if b.err != nil {
			return 0, b.err
		}
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err != nil {
		if err == io.EOF {
			b.finish(true)
		} else {
			b.err = err
			b.finish(false)
		}
	}
	return n, err
}

// Close ends the body. The inner body's Close is not called: it would
// read the rest of a long body; closing the connection is cheaper.
func (b *upBody) Close() error {
	if !b.done {
		b.finish(b.rc == http.NoBody)
		if b.err == nil {
			b.err = errors.New("read on closed body")
		}
	}
	return nil
}

func (b *upBody) finish(complete bool) {
	b.done = true
	stopped := b.stop()
	if complete && stopped && b.reuse && b.pc.br.Buffered() == 0 {
		b.pool.put(b.pc)
		return
	}
	_ = b.pc.c.Close()
}
