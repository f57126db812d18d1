package main

import (
	"bufio"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// The fasthttp proxy measures the front end the gateway did not choose:
// fasthttp's Server (its worker pool, zero-allocation parser and pooled
// request contexts) in front of the same Squid, doing what the goroutine
// floor does and nothing else. A plain request's head, as fasthttp parsed
// it, goes to Squid on a pooled keep-alive connection and Squid's answer is
// read with fasthttp's own reader and served back; a CONNECT goes to Squid,
// its 200 is answered, and the connection is hijacked and relayed both
// ways (fasthttp hands a hijacked connection over wrapped, so the relay
// copies through buffers where the gateway splices). No leases, checks
// or headers of its own. It runs only in the bench.

// fasthttpFloorEnv, when set, makes the bench binary run as the fasthttp
// proxy: "LISTEN-ADDR UPSTREAM-ADDR".
const fasthttpFloorEnv = "PROXYFLEET_BENCH_FASTHTTP"

// fhUpstream is one keep-alive connection to the upstream.
type fhUpstream struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// runFasthttpFloor serves until killed.
func runFasthttpFloor(listen, upstream string) error {
	idle := make(chan *fhUpstream, 256)
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if ctx.IsConnect() {
				fasthttpTunnel(ctx, upstream)
				return
			}
			fasthttpForward(ctx, upstream, idle)
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
	}
	return srv.ListenAndServe(listen)
}

// fasthttpForward sends the request to the upstream on an idle keep-alive
// connection (or a new one) and answers with the upstream's answer.
func fasthttpForward(ctx *fasthttp.RequestCtx, upstream string, idle chan *fhUpstream) {
	var u *fhUpstream
	select {
	case u = <-idle:
	default:
		c, err := net.DialTimeout("tcp", upstream, 10*time.Second)
		if err != nil {
			ctx.Error("upstream unreachable", fasthttp.StatusBadGateway)
			return
		}
		u = &fhUpstream{c: c, r: bufio.NewReaderSize(c, 4096), w: bufio.NewWriterSize(c, 4096)}
	}
	// The head as received: fasthttp keeps the absolute request URI a
	// proxy client sends. The bench's requests have no body.
	if _, err := u.w.Write(ctx.Request.Header.Header()); err != nil || u.w.Flush() != nil {
		u.c.Close()
		ctx.Error("upstream write failed", fasthttp.StatusBadGateway)
		return
	}
	if err := ctx.Response.Read(u.r); err != nil {
		u.c.Close()
		ctx.Error("upstream answer unreadable", fasthttp.StatusBadGateway)
		return
	}
	if ctx.Response.ConnectionClose() {
		u.c.Close() // the upstream ends this connection after its answer
		return
	}
	select {
	case idle <- u:
	default:
		u.c.Close()
	}
}

// fasthttpTunnel passes a CONNECT to the upstream, answers its 200 and
// relays the hijacked connection both ways.
func fasthttpTunnel(ctx *fasthttp.RequestCtx, upstream string) {
	up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		ctx.Error("upstream unreachable", fasthttp.StatusBadGateway)
		return
	}
	uw := bufio.NewWriterSize(up, 4096)
	var head fasthttp.ResponseHeader
	ur := bufio.NewReaderSize(up, 4096)
	if _, err := uw.Write(ctx.Request.Header.Header()); err != nil || uw.Flush() != nil || head.Read(ur) != nil ||
		head.StatusCode() != fasthttp.StatusOK || ur.Buffered() > 0 {
		up.Close()
		ctx.Error("upstream refused the tunnel", fasthttp.StatusBadGateway)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Hijack(func(c net.Conn) {
		defer up.Close()
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(up, c)
			_ = up.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		_, _ = io.Copy(c, up)
		<-done
	})
}
