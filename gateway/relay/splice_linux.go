//go:build linux

package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// spliceMax is the most one splice(2) moves into a pipe: a default pipe's
// capacity (16 pages). Larger pipes (F_SETPIPE_SZ) would save system calls
// on bulk transfers but count against the user's pipe-page limit, past which
// the kernel hands out one-page pipes.
const spliceMax = 64 << 10

// MaxIdlePipes bounds the pipes kept for reuse: enough for the relays that
// are moving bytes at one moment on a busy gateway, a small fixed number of
// descriptors on an idle one.
const MaxIdlePipes = 32

// pipe is one pipe(2) pair, both ends non-blocking.
type pipe struct{ r, w int }

func (p pipe) close() {
	_ = unix.Close(p.r)
	_ = unix.Close(p.w)
}

// pipePool keeps empty pipes for the splice relays. Go's own
// (*TCPConn).ReadFrom takes a pipe before it waits for data and holds it for
// as long as the connection is idle: two descriptors per direction, six for
// an idle tunnel instead of its two sockets, and the pipe's kernel memory.
// The relays here take a pipe only while bytes are in flight.
type pipePool struct {
	mu   sync.Mutex
	idle []pipe
}

func (pp *pipePool) get() (pipe, error) {
	pp.mu.Lock()
	if n := len(pp.idle); n > 0 {
		p := pp.idle[n-1]
		pp.idle = pp.idle[:n-1]
		pp.mu.Unlock()
		return p, nil
	}
	pp.mu.Unlock()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return pipe{}, err
	}
	return pipe{r: fds[0], w: fds[1]}, nil
}

// put takes back a pipe that is empty; one with bytes left in it must be
// closed instead, or the next tunnel would send them.
func (pp *pipePool) put(p pipe) {
	pp.mu.Lock()
	if len(pp.idle) < MaxIdlePipes {
		pp.idle = append(pp.idle, p)
		p = pipe{r: -1}
	}
	pp.mu.Unlock()
	if p.r >= 0 {
		p.close()
	}
}

// spliceRelay copies src to dst with splice(2) through a pooled pipe until
// src ends, and returns the bytes written to dst. The non-blocking splice
// into the pipe is itself the readiness test: when it finds nothing, the
// (empty) pipe goes back to the pool before the relay waits, so an idle
// direction holds no pipe, and bytes already there are never waited on.
//
// ok is false when splicing cannot go on here (no pipe to be had, or a
// kernel or socket that refuses splice); n bytes were moved by then and
// none are in flight, so the caller goes on with a buffered copy.
//
// With parkable, idle is true when src's read deadline passes while the
// relay waits or is about to: the relay returns with nothing in flight and
// holding no pipe, for its direction to be parked. The deadline is set
// by whoever starts the relay (tunnel.start, the parker's wake-up), never
// here: the runtime's timer code would grow the relay goroutine's stack
// past its first 2 KiB, and every tunnel would pay that.
func spliceRelay(pipes *pipePool, dst, src *net.TCPConn, parkable bool) (n int64, ok, idle bool, err error) {
	srcRC, err := src.SyscallConn()
	if err != nil {
		return 0, false, false, nil
	}
	dstRC, err := dst.SyscallConn()
	if err != nil {
		return 0, false, false, nil
	}
	var (
		p          pipe
		held       bool
		moved      int64
		fillErr    error
		left, sent int64
		drainErr   error
	)
	fill := func(fd uintptr) bool {
		if !held {
			if p, fillErr = pipes.get(); fillErr != nil {
				return true
			}
			held = true
		}
		for {
			moved, fillErr = rawSplice(int(fd), p.w, spliceMax)
			if fillErr != unix.EINTR {
				break
			}
		}
		if fillErr == unix.EAGAIN {
			pipes.put(p) // nothing was read: the pipe is empty
			held = false
			return false
		}
		return true
	}
	drain := func(fd uintptr) bool {
		for {
			sent, drainErr = rawSplice(p.r, int(fd), int(left))
			if drainErr != unix.EINTR {
				break
			}
		}
		return drainErr != unix.EAGAIN
	}
	for {
		if err := srcRC.Read(fill); err != nil {
			// Closed or past the deadline while waiting: fill had
			// given the pipe back before the wait.
			if parkable && errors.Is(err, os.ErrDeadlineExceeded) {
				return n, true, true, nil
			}
			return n, true, false, err
		}
		if fillErr != nil {
			if held {
				pipes.put(p) // a failed splice moved nothing into it
				held = false
			}
			if isSpliceUnsupported(fillErr) {
				return n, false, false, nil
			}
			return n, true, false, os.NewSyscallError("splice", fillErr)
		}
		if moved == 0 { // src ended
			pipes.put(p)
			return n, true, false, nil
		}
		for left = moved; left > 0; {
			if err := dstRC.Write(drain); err != nil {
				p.close()
				return n, true, false, err
			}
			if drainErr == nil && sent == 0 {
				drainErr = io.ErrShortWrite
			}
			if drainErr != nil {
				p.close() // bytes may be left in it
				return n, true, false, os.NewSyscallError("splice", drainErr)
			}
			left -= sent
			n += sent
		}
		pipes.put(p)
		held = false
	}
}

// isSpliceUnsupported: errors that say this pair cannot be spliced at all
// (or no pipe is to be had, as when descriptors run out), as opposed to a
// connection that failed.
func isSpliceUnsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) ||
		errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

// rawSplice is splice(2) between two non-blocking descriptors without the
// runtime's syscall bookkeeping (RawSyscall6: no entersyscall/exitsyscall).
func rawSplice(in, out, n int) (int64, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	if e != 0 {
		return 0, e
	}
	return int64(r), nil
}
