// Package keepalive keeps idle HTTP/1.1 keep-alive connections to one
// address, for clients that write a request and read its answer on their
// own goroutine instead of through net/http's Transport. The Transport runs
// two goroutines per connection and hands every request and answer between
// them and the caller; on a busy two-core box those hand-offs cost more CPU
// than the exchange itself (the gateway's lean path to an http:// upstream
// and the lease API client both measured it). This package dials, keeps,
// hands out and closes; Do runs the one get-or-dial loop that replaces a
// connection the peer dropped while it was idle, and RoundTrip is the one
// exchange on a connection (write, bounded head, answer timeout, abort by
// context, when a connection may be reused). What a caller does with the
// answer's body stays with the caller.
//
// It imports the standard library, internal/httphead and internal/rawio
// only.
package keepalive

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/rawio"
)

// Defaults of Options.
const (
	// DefaultBufSize is the read and write buffer of one connection.
	DefaultBufSize = 4 << 10
	// DefaultMaxIdle is how many idle connections a Pool keeps.
	DefaultMaxIdle = 64
	// DefaultIdleTimeout closes a connection idle for this long.
	DefaultIdleTimeout = 90 * time.Second
)

// ALongTimeAgo is a deadline in the past: setting it aborts blocked I/O.
var ALongTimeAgo = time.Unix(1, 0)

// Options configure a Pool; zero values take the defaults.
type Options struct {
	// DialTimeout bounds a dial (0: only the context does).
	DialTimeout time.Duration
	// MaxIdle is how many idle connections are kept (DefaultMaxIdle).
	MaxIdle int
	// IdleTimeout closes a connection idle this long (DefaultIdleTimeout).
	IdleTimeout time.Duration
	// BufSize is each connection's read and write buffer (DefaultBufSize).
	BufSize int
}

// Pool keeps idle keep-alive connections to one address.
type Pool struct {
	addr string
	o    Options

	mu     sync.Mutex
	idle   []*Conn // oldest first; reuse takes the newest
	closed bool
	sweep  *time.Timer // closes connections idle longer than IdleTimeout
}

// Conn is one connection with its buffers. R reads through a limit the
// caller sets with Limit (none at first), so that an answer head cannot
// grow without bound while the caller parses it.
type Conn struct {
	net.Conn
	R *bufio.Reader
	W *bufio.Writer

	lr     LimitReader
	raw    syscall.RawConn // for Unusable; nil when the conn has none
	idleAt time.Time
}

// NewPool returns a pool for addr (host:port).
func NewPool(addr string, o Options) *Pool {
	if o.MaxIdle <= 0 {
		o.MaxIdle = DefaultMaxIdle
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.BufSize <= 0 {
		o.BufSize = DefaultBufSize
	}
	return &Pool{addr: addr, o: o}
}

// Limit makes reads through R fail with err once n more bytes were read
// (counting from now); n < 0 lifts the limit.
func (c *Conn) Limit(n int64, err error) {
	c.lr.N, c.lr.Err = n, err
}

// ErrLimit is what a LimitReader answers at its limit when given no error.
var ErrLimit = errors.New("read limit reached")

// LimitReader reads from R until N bytes were read, then answers Err
// (ErrLimit when nil); N < 0 is no limit. Unlike io.LimitReader it can be
// re-armed between messages on one connection, and a caller tells a
// message that hit the limit (N == 0) from one that ended.
type LimitReader struct {
	R   io.Reader
	N   int64
	Err error
}

// Read implements io.Reader.
func (r *LimitReader) Read(p []byte) (int, error) {
	if r.N < 0 {
		return r.R.Read(p)
	}
	if r.N == 0 {
		if r.Err == nil {
			return 0, ErrLimit
		}
		return 0, r.Err
	}
	if int64(len(p)) > r.N {
		p = p[:r.N]
	}
	n, err := r.R.Read(p)
	r.N -= int64(n)
	return n, err
}

// Get returns the newest idle connection, nil when none. A connection idle
// past IdleTimeout, or one its peer closed or sent unasked bytes on
// (Unusable), is closed instead.
func (p *Pool) Get() *Conn {
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
		if time.Since(pc.idleAt) >= p.o.IdleTimeout || pc.Unusable() {
			_ = pc.Close()
			continue
		}
		return pc
	}
}

// Put hands back a connection whose last answer was read completely; it is
// closed instead when the pool is full or closed for good.
func (p *Pool) Put(pc *Conn) {
	pc.idleAt = time.Now()
	pc.lr.N = -1
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.o.MaxIdle {
		p.mu.Unlock()
		_ = pc.Close()
		return
	}
	p.idle = append(p.idle, pc)
	if p.sweep == nil {
		p.sweep = time.AfterFunc(p.o.IdleTimeout, p.sweepIdle)
	}
	p.mu.Unlock()
}

// sweepIdle closes connections idle for IdleTimeout and re-arms itself
// while any remain, so an unused pool does not hold sockets forever.
func (p *Pool) sweepIdle() {
	now := time.Now()
	var expired []*Conn
	p.mu.Lock()
	i := 0
	for i < len(p.idle) && now.Sub(p.idle[i].idleAt) >= p.o.IdleTimeout {
		i++
	}
	expired = append(expired, p.idle[:i]...)
	p.idle = append(p.idle[:0], p.idle[i:]...)
	if len(p.idle) > 0 {
		p.sweep.Reset(p.o.IdleTimeout - now.Sub(p.idle[0].idleAt))
	} else {
		p.sweep = nil
	}
	p.mu.Unlock()
	for _, pc := range expired {
		_ = pc.Close()
	}
}

// CloseIdle closes every idle connection; with final, connections handed
// back later are closed too (the peer is gone or replaced).
func (p *Pool) CloseIdle(final bool) {
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
		_ = pc.Close()
	}
}

// Closed reports whether the pool was closed for good (CloseIdle(true)).
func (p *Pool) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Idle is a snapshot of the idle connections, oldest first.
func (p *Pool) Idle() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Conn(nil), p.idle...)
}

// Do runs one exchange on the newest idle connection, or a new one. On
// success exchange owns the connection (it hands it back with Put, or
// closes it); on failure Do closes it. When a reused connection turns out
// stale (exchange says the peer closed it before a byte of an answer
// arrived: it dropped the connection while idle), its idle siblings are
// likely gone too (a restart), so they are closed and, if replay is not
// nil and succeeds in making the request ready to send again, the exchange
// starts over on fresh connections. A nil replay means the request may not
// be sent twice.
func (p *Pool) Do(ctx context.Context, replay func() error, exchange func(*Conn) (stale bool, err error)) error {
	for {
		pc := p.Get()
		reused := pc != nil
		if !reused {
			var err error
			if pc, err = p.Dial(ctx); err != nil {
				return err
			}
		}
		stale, err := exchange(pc)
		if err == nil {
			return nil
		}
		_ = pc.Close()
		if !reused || !stale || replay == nil || ctx.Err() != nil {
			return err
		}
		p.CloseIdle(false)
		if err := replay(); err != nil {
			return err
		}
	}
}

// Dial opens a new connection to the pool's address.
func (p *Pool) Dial(ctx context.Context) (*Conn, error) {
	d := net.Dialer{Timeout: p.o.DialTimeout}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	// The buffers read and write without a runtime system call each
	// (internal/rawio); Conn stays c for its deadlines and Close.
	rw := rawio.Wrap(c)
	pc := &Conn{Conn: c, lr: LimitReader{R: rw, N: -1}, raw: rawConnOf(rw)}
	pc.R = bufio.NewReaderSize(&pc.lr, p.o.BufSize)
	pc.W = bufio.NewWriterSize(rw, p.o.BufSize)
	return pc, nil
}

// rawConnOf is c's syscall.RawConn, nil when it has none. A Conn keeps it
// from its dial: SyscallConn allocates on every call, and Get asks it on
// every reuse.
func rawConnOf(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
