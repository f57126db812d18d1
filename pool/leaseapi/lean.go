package leaseapi

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
// (BenchmarkAPIAcquireRelease, 17k against 24k pairs/s), and a --lease-api
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
		var stale bool
		status, raw, stale, err = leanOnce(ctx, p, pc, req)
		return stale, err
	})
	if err != nil {
		return 0, nil, ctxErr(ctx, err)
	}
	return status, raw, nil
}

// leanOnce is one exchange on pc (keepalive's RoundTrip) with the whole
// body read. stale means the connection ended before a byte of the answer
// arrived. The connection's own deadline is only the overall bound; the
// context's end (its deadline included) comes through RoundTrip's abort,
// after ctx.Err() is set, so a call cut short always names the context.
func leanOnce(ctx context.Context, p *keepalive.Pool, pc *keepalive.Conn, req *http.Request) (status int, raw []byte, stale bool, err error) {
	a, stale, err := p.RoundTrip(ctx, pc, req, keepalive.ExchangeOptions{MaxHead: maxAnswerHead, HeadTooLarge: errAnswerHeadTooLarge,
		Closed: errClosedBeforeAnswer, Deadline: time.Now().Add(requestTimeout)})
	if err != nil {
		return 0, nil, stale, err
	}
	raw, err = io.ReadAll(io.LimitReader(a.Body, maxClientResponseBytes+1))
	if err != nil {
		a.Release(false)
		return 0, nil, false, fmt.Errorf("reading the answer: %w", err)
	}
	if len(raw) > maxClientResponseBytes {
		// The rest of the body is still on the connection, which is
		// closed rather than drained (closing the body would read it all).
		a.Release(false)
		return a.StatusCode, raw[:maxClientResponseBytes], false, nil
	}
	_ = a.Body.Close() // at its end already: reads the trailer, if any
	a.Release(true)
	return a.StatusCode, raw, false, nil
}

// ctxErr names the context's end as the cause when it was one: the
// connection only saw its deadline move into the past.
func ctxErr(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
