// Package clientbody is a client's request body as the gateway forwards
// it: read ahead before anything is leased, its read errors the client's
// faults (fault.Client), never a member's, and whether the forwarding is
// waiting on the client. It knows nothing of members or leases.
package clientbody

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/front"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
)

// Body is a request body as the gateway forwards it. Its read errors
// are clientFaults, so a body the client botches (net/http's Transport
// hands a body read error back as the round trip's error) is the client's,
// never the member's. It also says whether the forwarding is waiting on
// the client (stalled). (That nothing reads a connection's buffers after
// its request ended is the front end's guard, below this one.)
type Body struct {
	mu   sync.Mutex // held by Read
	rc   io.ReadCloser
	req  *http.Request // its trailers are checked at the body's end
	read atomic.Int64
	err  error // the first read error, a *fault.Client (or errAbandoned)
	eof  bool
	// ahead is what ReadAhead took in and Read has not handed on yet.
	ahead []byte
	// reading is set while a Read waits on the client.
	reading atomic.Bool
}

// New wraps rc, the body of req.
func New(req *http.Request, rc io.ReadCloser) *Body {
	return &Body{rc: rc, req: req}
}

func (b *Body) Read(p []byte) (int, error) {
	b.reading.Store(true)
	defer b.reading.Store(false)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case len(b.ahead) > 0:
		n := copy(p, b.ahead)
		b.ahead = b.ahead[n:]
		return n, nil
	case b.err != nil:
		return 0, b.err
	case b.eof:
		return 0, io.EOF
	}
	return b.readLocked(p)
}

// readLocked reads from the client, b.mu held.
func (b *Body) readLocked(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	read := b.read.Add(int64(n))
	switch {
	case err == io.EOF:
		if name, ok := front.InvalidFieldName(b.req.Trailer); !ok {
			b.err = &fault.Client{Reason: fault.ReasonBadRequest, Outcome: fault.ReasonBadRequest,
				Err: errors.New("malformed request trailer name " + echo.Quote(name))}
			return n, b.err
		}
		b.eof = true
	case err != nil:
		b.err = fault.ClientRead(err, read)
		return n, b.err
	}
	return n, err
}

// ReadAhead takes in up to limit bytes of the body before anything is
// leased or sent on, and returns the client's fault if the body showed one
// meanwhile. A body that ends within limit (most do: forms, JSON) is then
// known whole and well-framed before a member sees a byte of it, and a
// client that dawdles over it holds no member; a longer one streams on
// from where this stopped.
func (b *Body) ReadAhead(limit int) *fault.Client {
	b.reading.Store(true)
	defer b.reading.Store(false)
	b.mu.Lock()
	buf := make([]byte, 0, min(limit, 4<<10))
	for len(buf) < limit && !b.eof && b.err == nil {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(cap(buf), limit-len(buf)))
		}
		n, _ := b.readLocked(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
	}
	b.ahead = buf
	b.mu.Unlock()
	return b.Fault()
}

// Whole returns the body's length when ReadAhead took all of it in, and
// whether it did. A body with trailers is not whole: only chunks carry them.
func (b *Body) Whole() (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.eof || len(b.req.Trailer) > 0 {
		return 0, false
	}
	return int64(len(b.ahead)), true
}

// Close closes the body as net/http's does (a Transport closes the body it
// sent).
func (b *Body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rc.Close()
}

// Fault is the client's fault the body ended with, nil when none (or no
// body).
func (b *Body) Fault() *fault.Client {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var cf *fault.Client
	if errors.As(b.err, &cf) {
		return cf
	}
	return nil
}

// Stalled reports whether the forwarding waits on the client for more of
// its body: a deadline that passes now is the client's, not the member's.
func (b *Body) Stalled() bool {
	return b != nil && b.reading.Load() && !b.done()
}

// BytesRead is how much of the body arrived so far.
func (b *Body) BytesRead() int64 { return b.read.Load() }

func (b *Body) done() bool {
	if !b.mu.TryLock() {
		return false // a Read is under way, so the body is not done
	}
	defer b.mu.Unlock()
	return b.eof || b.err != nil
}
