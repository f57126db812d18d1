//go:build linux

package rawio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// conn is a net.Conn whose Read and Write are raw. Like net.Conn's, its
// methods may be called from several goroutines at once: a call's buffer
// and result live in the conn (a closure made per call would allocate),
// so each direction has a lock around them, uncontended in every caller
// of ours (one reader and one writer per connection).
type conn struct {
	net.Conn
	rc syscall.RawConn

	rmu     sync.Mutex
	rp      []byte
	rn      int
	rerr    syscall.Errno
	readFn  func(uintptr) bool
	wmu     sync.Mutex
	wp      []byte
	wn      int
	werr    syscall.Errno
	writeFn func(uintptr) bool
}

func wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	x := &conn{Conn: c, rc: rc}
	// Bound once per connection: a method value made per call allocates.
	x.readFn, x.writeFn = x.read, x.write
	return x
}

// SyscallConn is c's, made once when it was wrapped (net's allocates a new
// one on every call).
func (x *conn) SyscallConn() (syscall.RawConn, error) { return x.rc, nil }

// Read is net.Conn's: some bytes, io.EOF when the peer ended, or an error
// (a passed read deadline, a closed or reset connection).
func (x *conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	x.rmu.Lock()
	x.rp, x.rn, x.rerr = p, 0, 0
	err := x.rc.Read(x.readFn)
	n, rerr := x.rn, x.rerr
	x.rp = nil
	x.rmu.Unlock()
	switch {
	case err != nil:
		return 0, x.opError("read", err)
	case rerr != 0:
		return 0, x.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (x *conn) read(fd uintptr) bool {
	for {
		n, e := sysRead(fd, x.rp)
		switch e {
		case 0:
			x.rn = int(n)
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // wait until readable
		default:
			x.rerr = e
			return true
		}
	}
}

// Write is net.Conn's: all of p, or an error (a passed write deadline, a
// closed or reset connection) with what was written by then.
func (x *conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	x.wmu.Lock()
	x.wp, x.wn, x.werr = p, 0, 0
	err := x.rc.Write(x.writeFn)
	n, werr := x.wn, x.werr
	x.wp = nil
	x.wmu.Unlock()
	switch {
	case err != nil:
		return n, x.opError("write", err)
	case werr != 0:
		return n, x.opError("write", os.NewSyscallError("write", werr))
	}
	return n, nil
}

func (x *conn) write(fd uintptr) bool {
	for x.wn < len(x.wp) {
		rest := x.wp[x.wn:]
		n, e := sysWrite(fd, rest)
		switch e {
		case 0:
			x.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // wait until writable
		default:
			x.werr = e
			return true
		}
	}
	return true
}

// opError is err as net.Conn's Read and Write return it: a *net.OpError
// named op. RawConn's own (a deadline, a closed connection) says
// "raw-read" or "raw-write"; only its name changes.
func (x *conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = op
		return &e
	}
	return &net.OpError{Op: op, Net: x.LocalAddr().Network(), Source: x.LocalAddr(), Addr: x.RemoteAddr(), Err: err}
}
