package poolapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/keepalive"
)

// The lean exchange: a client built without an HTTPClient of the caller's
// sends each call to an http:// lease API on a pooled keep-alive
// connection (internal/keepalive) and reads the answer on the calling
// goroutine, instead of through net/http's Transport, whose two goroutines
// per connection and the hand-offs between them and the caller cost more
// CPU than the call itself: an acquire plus a release over loopback took
// 91 µs of client and server CPU through the Transport and 57 µs this way
// (BenchmarkAPIAcquireRelease, 17k against 24k pairs/s), and a --pool-api
// gateway makes such calls for every new (session, target). https:// bases
// and callers' own clients keep the Transport.

const (
	// requestTimeout bounds one call, as the default http.Client's Timeout.
	requestTimeout = 30 * time.Second
	// maxAnswerHead bounds an answer's head.
	maxAnswerHead = 1 << 20
)

var (
	errAnswerHeadTooLarge = errors.New("answer head larger than 1 MiB")
	errClosedBeforeAnswer = errors.New("the lease API closed the keep-alive connection before answering")
)

// leanPools makes a pool for every http:// base (by base; a base listed
// twice shares one).
func leanPools(bases []string) map[string]*keepalive.Pool {
	pools := map[string]*keepalive.Pool{}
	for _, b := range bases {
		u, err := url.Parse(b)
		if err != nil || u.Scheme != "http" || pools[b] != nil {
			continue
		}
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
		pools[b] = keepalive.NewPool(addr, keepalive.Options{DialTimeout: 5 * time.Second, MaxIdle: 256, IdleTimeout: 90 * time.Second})
	}
	return pools
}

// leanDo sends req and returns the status and the whole body (at most
// maxClientResponseBytes, as the Transport path reads). A kept-alive
// connection the server closed while idle is replaced by a fresh one and
// the call sent again: every lease call may be repeated (see Client.do).
func leanDo(ctx context.Context, p *keepalive.Pool, req *http.Request) (status int, raw []byte, err error) {
	replay := func() error {
		if req.GetBody == nil {
			return nil
		}
		body, err := req.GetBody()
		req.Body = body
		return err
	}
	err = p.Do(ctx, replay, func(pc *keepalive.Conn) (bool, error) {
		var keep, stale bool
		status, raw, keep, stale, err = leanOnce(ctx, pc, req)
		switch {
		case err != nil:
		case keep:
			p.Put(pc)
		default:
			_ = pc.Close()
		}
		return stale, err
	})
	if err != nil {
		return 0, nil, ctxErr(ctx, err)
	}
	return status, raw, nil
}

// leanOnce is one exchange on pc. stale means the connection ended before
// a byte of the answer arrived; keep that it may carry the next call.
func leanOnce(ctx context.Context, pc *keepalive.Conn, req *http.Request) (status int, raw []byte, keep, stale bool, err error) {
	// The connection's own deadline is only the overall bound; the
	// context's end (its deadline included) comes through AfterFunc, after
	// ctx.Err() is set, so a call cut short always names the context.
	_ = pc.SetDeadline(time.Now().Add(requestTimeout))
	stop := context.AfterFunc(ctx, func() { _ = pc.SetDeadline(keepalive.ALongTimeAgo) })
	defer func() {
		if !stop() {
			keep = false // the context ended: the deadline is in the past
		}
	}()
	if err = req.Write(pc.W); err == nil {
		err = pc.W.Flush()
	}
	if err != nil {
		return 0, nil, false, true, err
	}
	pc.Limit(maxAnswerHead, errAnswerHeadTooLarge)
	if _, err = pc.R.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			err = errClosedBeforeAnswer
		}
		return 0, nil, false, true, err
	}
	resp, err := http.ReadResponse(pc.R, req)
	if err != nil {
		return 0, nil, false, false, err
	}
	pc.Limit(-1, nil)
	raw, err = io.ReadAll(io.LimitReader(resp.Body, maxClientResponseBytes+1))
	if err != nil {
		return 0, nil, false, false, fmt.Errorf("reading the answer: %w", err)
	}
	if len(raw) > maxClientResponseBytes {
		// The rest of the body is still on the connection, which is
		// closed rather than drained (closing the body would read it all).
		return resp.StatusCode, raw[:maxClientResponseBytes], false, false, nil
	}
	_ = resp.Body.Close() // at its end already: reads the trailer, if any
	keep = !resp.Close && pc.R.Buffered() == 0
	if keep {
		_ = pc.SetDeadline(time.Time{})
	}
	return resp.StatusCode, raw, keep, false, nil
}

// ctxErr names the context's end as the cause when it was one: the
// connection only saw its deadline move into the past.
func ctxErr(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
