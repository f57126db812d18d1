package keepalive

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/httphead"
)

// ErrAnswerTimeout is what RoundTrip answers when ExchangeOptions'
// AnswerTimeout passed before the answer's first byte.
var ErrAnswerTimeout = errors.New("no answer within the answer timeout")

// ErrSwitched is an answer 101 Switching Protocols: RoundTrip's callers ask
// for no upgrade.
var ErrSwitched = errors.New("answered 101 Switching Protocols to a request that asked for no upgrade")

// ExchangeOptions shape one RoundTrip.
type ExchangeOptions struct {
	// Proxy writes the request line in absolute form (to a forward proxy).
	Proxy bool
	// MaxHead bounds the answer's head, 1xx heads included; reading past
	// it fails with HeadTooLarge.
	MaxHead      int64
	HeadTooLarge error
	// Closed is the error for a connection that ended before the answer's
	// first byte (then reported stale).
	Closed error
	// Deadline bounds the whole exchange, the answer's body included, until
	// Release; zero is none.
	Deadline time.Time
	// AnswerTimeout bounds the wait for the answer's first byte from when
	// the request is written (ErrAnswerTimeout); zero is none.
	AnswerTimeout time.Duration
}

// Answer is an answer head RoundTrip read, its connection still carrying
// the body: read it, then Release.
type Answer struct {
	*http.Response
	pc   *Conn
	pool *Pool
	stop func() bool
}

// RoundTrip is the one keep-alive exchange: write req on pc, read the
// answer's head (interim 1xx answers skipped) under o's bounds, ctx
// aborting it at any point until Release. stale reports that the
// connection ended before a byte of an answer arrived, so that Do may send
// the request again on another. On an error the caller (Do) closes pc.
func (p *Pool) RoundTrip(ctx context.Context, pc *Conn, req *http.Request, o ExchangeOptions) (a Answer, stale bool, err error) {
	if !o.Deadline.IsZero() {
		_ = pc.SetDeadline(o.Deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = pc.SetDeadline(ALongTimeAgo) })
	defer func() {
		if err != nil {
			stop()
		}
	}()
	err = httphead.WriteRequest(pc.W, req, o.Proxy)
	if err == nil {
		err = pc.W.Flush()
	}
	if err != nil {
		return Answer{}, true, err
	}
	pc.Limit(o.MaxHead, o.HeadTooLarge)
	if o.AnswerTimeout > 0 {
		setReadDeadline(ctx, pc, time.Now().Add(o.AnswerTimeout))
	}
	if _, err = pc.R.Peek(1); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return Answer{}, true, o.Closed
		case o.AnswerTimeout > 0 && isTimeout(err) && ctx.Err() == nil:
			return Answer{}, false, ErrAnswerTimeout
		}
		return Answer{}, true, err
	}
	if o.AnswerTimeout > 0 {
		// The first byte is in: the rest runs under the overall bound only.
		setReadDeadline(ctx, pc, o.Deadline)
	}
	for {
		resp, err := http.ReadResponse(pc.R, req)
		switch {
		case err != nil && pc.lr.N == 0 && o.HeadTooLarge != nil:
			// Cut by the bound: whatever the parser made of the cut line
			// ("missing colon" when it fell in a name), the head was too large.
			return Answer{}, false, o.HeadTooLarge
		case err != nil:
			return Answer{}, false, err
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return Answer{}, false, ErrSwitched
		case resp.StatusCode >= 200:
			pc.Limit(-1, nil)
			return Answer{Response: resp, pc: pc, pool: p, stop: stop}, false, nil
		}
	}
}

// Release ends the exchange: the connection goes back to the pool when
// reuse says its answer was read to the end, the answer did not close it,
// nothing unasked sits behind it and ctx did not abort it; else it closes.
func (a Answer) Release(reuse bool) {
	if a.stop() && reuse && !a.Response.Close && a.pc.R.Buffered() == 0 {
		_ = a.pc.SetDeadline(time.Time{})
		a.pool.Put(a.pc)
		return
	}
	_ = a.pc.Close()
}

// setReadDeadline sets pc's read deadline, then applies an abort of ctx
// again that the new deadline may have undone (the abort sets a deadline
// in the past from another goroutine).
func setReadDeadline(ctx context.Context, pc *Conn, t time.Time) {
	_ = pc.SetReadDeadline(t)
	if ctx.Err() != nil {
		_ = pc.SetDeadline(ALongTimeAgo)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
