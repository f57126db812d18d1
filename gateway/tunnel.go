package gateway

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

// tunnel is one hijacked CONNECT: the client connection and the connection
// to the upstream (or the target, for a direct member).
type tunnel struct {
	mu               sync.Mutex
	closed           bool
	client, upstream net.Conn

	// Set by start; up and down count the relays' bytes, finished the
	// directions that ended (under mu).
	bufs     *bufPool
	done     func(up, down int64)
	up, down int64
	finished int
	grace    *time.Timer
}

// setClient records the hijacked client connection; false (and the
// connection closed) when the tunnel was closed meanwhile by Shutdown.
func (t *tunnel) setClient(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = c.Close()
		return false
	}
	t.client = c
	return true
}

func (t *tunnel) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.client != nil {
		_ = t.client.Close()
	}
	_ = t.upstream.Close()
}

// tunnelSet tracks open tunnels for Shutdown: net/http forgets hijacked
// connections, so the gateway waits for (and at the deadline closes) them.
type tunnelSet struct {
	mu     sync.Mutex
	m      map[*tunnel]struct{}
	closed bool          // Shutdown gave up waiting: refuse new tunnels
	empty  chan struct{} // closed when m becomes empty while someone waits
}

// add registers t; false means the gateway is being forcibly shut down.
func (s *tunnelSet) add(t *tunnel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = make(map[*tunnel]struct{})
	}
	s.m[t] = struct{}{}
	return true
}

func (s *tunnelSet) remove(t *tunnel) {
	s.mu.Lock()
	delete(s.m, t)
	if len(s.m) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
	s.mu.Unlock()
}

// wait blocks until no tunnel is open or ctx ends.
func (s *tunnelSet) wait(ctx context.Context) error {
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

// closeAll closes every open tunnel and refuses new ones.
func (s *tunnelSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	ts := make([]*tunnel, 0, len(s.m))
	for t := range s.m {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	for _, t := range ts {
		t.close()
	}
}

// count is the number of open tunnels (tests).
func (s *tunnelSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// copyBufSize is the pooled buffer for copies the kernel cannot splice (TLS
// to an https:// upstream, response bodies); TCP↔TCP copies use splice(2).
const copyBufSize = 16 << 10

// bufPool hands out what a relay copies through: buffers for the copies the
// kernel cannot splice, and pipes for those it can. The Gateway owns one.
type bufPool struct {
	p     sync.Pool
	pipes pipePool
}

func (b *bufPool) get() *[]byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return v
	}
	buf := make([]byte, copyBufSize)
	return &buf
}

func (b *bufPool) put(v *[]byte) { b.p.Put(v) }

// relay copies src to dst until EOF or error, then half-closes dst.
func relay(bufs *bufPool, dst, src net.Conn) (int64, error) {
	var n int64
	var err error
	dstTCP, dok := dst.(*net.TCPConn)
	srcTCP, sok := src.(*net.TCPConn)
	spliced := false
	if dok && sok {
		// splice(2) through a pipe taken only while bytes are in flight:
		// no user-space buffer, and an idle tunnel holds its two sockets
		// and nothing else (splice_linux.go).
		n, spliced, err = spliceRelay(&bufs.pipes, dstTCP, srcTCP)
	}
	if !spliced {
		// What splicing moved before it had to stop is counted; nothing
		// was in flight, so the copy goes on from where it stopped.
		bp := bufs.get()
		m, cerr := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
		bufs.put(bp)
		n, err = n+m, cerr
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	return n, err
}

type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

// start relays both ways, each direction on a goroutine of its own with
// nothing but the relay on its stack, so an idle tunnel holds two
// goroutines at their smallest stack size and no third one waiting for
// them. Once one direction ends, the other gets tunnelCloseGrace before
// both connections are closed; the direction that ends last closes the
// tunnel and calls done with the bytes each way.
func (t *tunnel) start(bufs *bufPool, done func(up, down int64)) {
	t.bufs, t.done = bufs, done
	go t.relayUp()
	go t.relayDown()
}

func (t *tunnel) relayUp() {
	n, _ := relay(t.bufs, t.upstream, t.client)
	t.ended(&t.up, n)
}

func (t *tunnel) relayDown() {
	n, _ := relay(t.bufs, t.client, t.upstream)
	t.ended(&t.down, n)
}

// ended records one direction's bytes and, for the second, ends the tunnel.
func (t *tunnel) ended(counter *int64, n int64) {
	t.mu.Lock()
	*counter += n
	t.finished++
	last := t.finished == 2
	if !last {
		t.grace = time.AfterFunc(tunnelCloseGrace, t.close)
	} else if t.grace != nil {
		t.grace.Stop()
	}
	up, down := t.up, t.down
	t.mu.Unlock()
	if last {
		t.close()
		t.done(up, down)
	}
}
