package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
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
)

var (
	errHeadTooLarge   = errors.New("upstream answer head larger than 1 MiB")
	errUpstreamClosed = errors.New("upstream closed the keep-alive connection before answering")
)

// upstreamPool keeps idle keep-alive connections to one http:// upstream
// (internal/keepalive) and runs the lean exchange over them.
type upstreamPool struct {
	*keepalive.Pool
}

// upConn is one connection to the upstream with its buffers.
type upConn = keepalive.Conn

func newUpstreamPool(addr string, dialTimeout time.Duration) *upstreamPool {
	return &upstreamPool{keepalive.NewPool(addr, keepalive.Options{DialTimeout: dialTimeout, MaxIdle: maxIdlePerHost, IdleTimeout: idleConnTimeout})}
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
// pool once read to the end. ctx aborts the exchange, body included; the
// answer's first byte must arrive within answerTimeout of the request's
// write (else fault.ErrAnswerTimeout). A kept-alive connection that turns out
// closed is replaced by a fresh one when the request may be resent.
func (p *upstreamPool) roundTrip(ctx context.Context, req *http.Request, proxyAuth string, answerTimeout time.Duration) (*http.Response, error) {
	if proxyAuth != "" {
		// Only for this member: a retry may go through another one.
		req.Header["Proxy-Authorization"] = []string{proxyAuth}
		defer delete(req.Header, "Proxy-Authorization")
	}
	var replay func() error
	if replayable(req) {
		replay = func() error { return nil } // the lean path carries no body
	}
	o := keepalive.ExchangeOptions{Proxy: true, MaxHead: maxResponseHead, HeadTooLarge: errHeadTooLarge,
		Closed: errUpstreamClosed, AnswerTimeout: answerTimeout}
	var resp *http.Response
	err := p.Do(ctx, replay, func(pc *upConn) (stale bool, err error) {
		a, stale, err := p.RoundTrip(ctx, pc, req, o)
		if err != nil {
			return stale, err
		}
		resp = a.Response
		resp.Body = &upBody{rc: resp.Body, a: a}
		return false, nil
	})
	if errors.Is(err, keepalive.ErrAnswerTimeout) {
		err = fault.ErrAnswerTimeout
	}
	return resp, err
}

// upBody is an answer body on the lean path: read to its end, it hands the
// connection back; closed early or broken, it closes the connection.
type upBody struct {
	rc   io.ReadCloser
	a    keepalive.Answer
	done bool
	err  error
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
	b.a.Release(complete)
}
