package relay

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// tunnelCloseGrace is how long a tunnel stays up after one direction ended
// (the peer half-closed) before both connections are closed, so a peer that
// never closes its side cannot hold the tunnel forever.
const tunnelCloseGrace = 5 * time.Second

// Tunnel is one hijacked CONNECT (or upgraded WebSocket): the client
// connection and the connection to the upstream (or the target, for a
// direct member), relayed both ways once started.
type Tunnel struct {
	mu               sync.Mutex
	closed           bool
	client, upstream net.Conn

	// Set by Start; up and down count the relays' bytes, finished the
	// directions that ended (under mu).
	bufs      *Bufs
	idleAfter time.Duration
	done      func(up, down int64)
	upDir     direction
	downDir   direction
	up, down  int64
	finished  int
	grace     *time.Timer
}

// direction is one way of a tunnel. Its relay runs on a goroutine of its
// own; when it is waiting for its source as the read deadline idleAfter
// after its start (or wake-up) passes, the goroutine ends and the direction
// is parked (park_linux.go) until the source is readable or hung up, so an
// idle tunnel holds no goroutine, only its two sockets.
type direction struct {
	t        *Tunnel
	dst, src net.Conn
	count    *int64 // the tunnel's up or down, added to when the relay ends
	n        int64  // bytes relayed so far, touched only by the running relay
	noPark   bool   // never parked (not two TCP connections, parking off, or it failed once)
	parked   uint64 // under t.mu: the parking's ticket, 0 when not parked
}

// New is a tunnel to upstream; its client is set by SetClient once the
// client's connection is taken over, and its relays run from Start.
func New(upstream net.Conn) *Tunnel { return &Tunnel{upstream: upstream} }

// SetClient records the hijacked client connection; false (and the
// connection closed) when the tunnel was closed meanwhile by Shutdown.
func (t *Tunnel) SetClient(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = c.Close()
		return false
	}
	t.client = c
	return true
}

// Close closes both connections. A parked direction is taken back from
// the parker first (before its socket's descriptor can be reused) and its
// relay run once more, which finds the connection closed and ends it.
func (t *Tunnel) Close() {
	var wake []*direction
	t.mu.Lock()
	t.closed = true
	for _, d := range []*direction{&t.upDir, &t.downDir} {
		if d.parked != 0 && unpark(d.parked) {
			d.parked = 0
			wake = append(wake, d)
		}
	}
	if t.client != nil {
		_ = t.client.Close()
	}
	_ = t.upstream.Close()
	t.mu.Unlock()
	for _, d := range wake {
		go d.run()
	}
}

// Set tracks open tunnels for Shutdown: net/http forgets hijacked
// connections, so the gateway waits for (and at the deadline closes) them.
type Set struct {
	mu     sync.Mutex
	m      map[*Tunnel]struct{}
	closed bool          // Shutdown gave up waiting: refuse new tunnels
	empty  chan struct{} // closed when m becomes empty while someone waits
}

// Add registers t; false means the gateway is being forcibly shut down.
func (s *Set) Add(t *Tunnel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = make(map[*Tunnel]struct{})
	}
	s.m[t] = struct{}{}
	return true
}

// Remove forgets t once its relays ended (or it never started).
func (s *Set) Remove(t *Tunnel) {
	s.mu.Lock()
	delete(s.m, t)
	if len(s.m) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
	s.mu.Unlock()
}

// Wait blocks until no tunnel is open or ctx ends.
func (s *Set) Wait(ctx context.Context) error {
	s.mu.Lock()
	if len(s.m) == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.empty == nil {
		s.empty = make(chan struct{})
	}
	ch := s.empty
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CloseAll closes every open tunnel and refuses new ones.
func (s *Set) CloseAll() {
	s.mu.Lock()
	s.closed = true
	ts := make([]*Tunnel, 0, len(s.m))
	for t := range s.m {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	for _, t := range ts {
		t.Close()
	}
}

// Count is the number of open tunnels (tests).
func (s *Set) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// copyBufSize is the pooled buffer for copies the kernel cannot splice (TLS
// to an https:// upstream, response bodies); TCP↔TCP copies use splice(2).
const copyBufSize = 16 << 10

// Bufs hands out what a relay copies through: buffers for the copies the
// kernel cannot splice, and pipes for those it can. A gateway owns one.
type Bufs struct {
	p     sync.Pool
	pipes pipePool
}

// Get is a copy buffer of copyBufSize bytes; Put gives it back.
func (b *Bufs) Get() *[]byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return v
	}
	buf := make([]byte, copyBufSize)
	return &buf
}

// Put gives back a buffer Get handed out.
func (b *Bufs) Put(v *[]byte) { b.p.Put(v) }

// relay copies src to dst until EOF or error, then half-closes dst; or,
// when parkable, until src's read deadline passes (idle: nothing in
// flight, dst left open), when the two are TCP and splice.
func relay(bufs *Bufs, dst, src net.Conn, parkable bool) (n int64, idle bool, err error) {
	dstTCP, dok := dst.(*net.TCPConn)
	srcTCP, sok := src.(*net.TCPConn)
	spliced := false
	if dok && sok {
		// splice(2) through a pipe taken only while bytes are in flight:
		// no user-space buffer, and an idle tunnel holds its two sockets
		// and nothing else (splice_linux.go).
		n, spliced, idle, err = spliceRelay(&bufs.pipes, dstTCP, srcTCP, parkable)
		if idle {
			return n, true, nil
		}
	}
	if !spliced {
		// What splicing moved before it had to stop is counted; nothing
		// was in flight, so the copy goes on from where it stopped,
		// without the idle deadline a parkable relay's source has.
		if parkable {
			_ = src.SetReadDeadline(time.Time{})
		}
		bp := bufs.Get()
		m, cerr := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
		bufs.Put(bp)
		n, err = n+m, cerr
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	return n, false, err
}

type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

// Start relays both ways, each direction on a goroutine of its own with
// nothing but the relay on its stack and no third one waiting for them.
// With idleAfter > 0, each direction's source gets a read deadline that
// far ahead; when a relay is waiting (or about to) as it passes, the
// direction gives its goroutine up and is parked until its source is
// readable, and its wake-up sets the next deadline. A busy direction is
// so parked and woken at once every idleAfter, a few system calls; an
// idle one holds no goroutine. Once one direction ends, the other gets
// tunnelCloseGrace before both connections are closed; the direction that
// ends last closes the tunnel and calls done with the bytes each way.
func (t *Tunnel) Start(bufs *Bufs, idleAfter time.Duration, done func(up, down int64)) {
	// Under mu: Shutdown's closeAll may be reading the directions already.
	_, clientTCP := t.client.(*net.TCPConn)
	_, upstreamTCP := t.upstream.(*net.TCPConn)
	noPark := idleAfter <= 0 || !clientTCP || !upstreamTCP // only a splice relay parks
	t.mu.Lock()
	t.bufs, t.idleAfter, t.done = bufs, idleAfter, done
	t.upDir = direction{t: t, dst: t.upstream, src: t.client, count: &t.up, noPark: noPark}
	t.downDir = direction{t: t, dst: t.client, src: t.upstream, count: &t.down, noPark: noPark}
	t.mu.Unlock()
	if !noPark {
		at := time.Now().Add(idleAfter)
		_ = t.client.SetReadDeadline(at)
		_ = t.upstream.SetReadDeadline(at)
	}
	go t.upDir.run()
	go t.downDir.run()
}

// run relays until the direction ends or is parked.
func (d *direction) run() {
	for {
		n, idle, _ := relay(d.t.bufs, d.dst, d.src, !d.noPark)
		d.n += n
		if !idle {
			break
		}
		if d.t.park(d) {
			return
		}
		if d.noPark {
			// The deadline has passed; waiting on the goroutine from
			// now on needs none.
			_ = d.src.SetReadDeadline(time.Time{})
		}
	}
	d.t.ended(d.count, d.n)
}

// resume is the parker's wake-up: the source is readable (or hung up).
// The wake-up has set the next deadline.
func (d *direction) resume() {
	d.t.mu.Lock()
	d.parked = 0
	d.t.mu.Unlock()
	d.run()
}

// park hands d to the parker; false when the tunnel is closing (the relay
// then finds its connection closed) or parking is not to be had here (the
// relay then waits on its goroutine from now on).
func (t *Tunnel) park(d *direction) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	ticket, ok := park(d)
	if !ok {
		d.noPark = true
		return false
	}
	d.parked = ticket
	return true
}

// ended records one direction's bytes and, for the second, ends the tunnel.
func (t *Tunnel) ended(counter *int64, n int64) {
	t.mu.Lock()
	*counter += n
	t.finished++
	last := t.finished == 2
	if !last {
		t.grace = time.AfterFunc(tunnelCloseGrace, t.Close)
	} else if t.grace != nil {
		t.grace.Stop()
	}
	up, down := t.up, t.down
	t.mu.Unlock()
	if last {
		t.Close()
		t.done(up, down)
	}
}
