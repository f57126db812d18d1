//go:build linux

package relay

import (
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parker holds the tunnel directions whose source is idle, without a
// goroutine each: their sockets are in one epoll set of the gateway's own
// (beside the runtime's netpoller, which keeps its registration), one-shot
// and level-triggered, and one goroutine waits on it for the process. A
// parked direction costs its socket's registration and a map entry instead
// of a goroutine's stack (2 KiB or more) and its g; an idle tunnel, two of
// those, was most of what it cost.
//
// One for the process, as the runtime's netpoller is: what it holds is one
// thread blocked in epoll_wait and one descriptor; a direction leaves it
// when its source wakes up or its tunnel closes.
type parker struct {
	once sync.Once
	epfd int // -1 when epoll could not be had: nothing parks

	mu     sync.Mutex
	broken bool // epoll_wait failed: nothing parks any more
	next   uint64
	parked map[uint64]*direction
}

var idleParker parker

// parkEvents: readable, or the peer shut its side (which a splice then
// reads as EOF); EPOLLERR and EPOLLHUP are always reported.
const parkEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

func (p *parker) init() {
	p.once.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			p.epfd = -1
			return
		}
		p.epfd = fd
		p.parked = make(map[uint64]*direction)
		go p.wait()
	})
}

// park registers d's source and returns its ticket; false when it cannot
// be (no epoll, or the socket refused), and d's relay then waits on its
// own goroutine. The caller holds d's tunnel's lock, so the tunnel cannot
// close (and the descriptor cannot be reused) meanwhile. d.resume runs on
// a new goroutine once the source is readable; unpark takes d back instead.
func park(d *direction) (uint64, bool) {
	p := &idleParker
	p.init()
	if p.epfd < 0 {
		return 0, false
	}
	sc, ok := d.src.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	p.mu.Lock()
	if p.broken {
		p.mu.Unlock()
		return 0, false
	}
	p.next++
	ticket := p.next
	p.parked[ticket] = d
	p.mu.Unlock()
	var ctlErr error
	err = rc.Control(func(fd uintptr) {
		ev := unix.EpollEvent{Events: parkEvents, Fd: int32(uint32(ticket)), Pad: int32(uint32(ticket >> 32))}
		// A socket parked before keeps its (disarmed) registration until
		// it is closed, when the kernel drops it: modify it, else add.
		if ctlErr = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, int(fd), &ev); ctlErr == unix.ENOENT {
			ctlErr = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		}
	})
	if err == nil {
		err = ctlErr
	}
	if err != nil {
		p.mu.Lock()
		delete(p.parked, ticket) // no event can have taken it: none was armed
		p.mu.Unlock()
		return 0, false
	}
	parkCollector.parked()
	return ticket, true
}

// unpark takes a parked direction back; false when its wake-up has already
// taken it (resume then runs, or is about to).
func unpark(ticket uint64) bool {
	p := &idleParker
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.parked[ticket]; !ok {
		return false
	}
	delete(p.parked, ticket)
	return true
}

// wait hands each woken direction to a goroutine of its own. An event whose
// ticket is gone (its tunnel closed meanwhile) is dropped.
func (p *parker) wait() {
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			// Not expected for a valid epoll descriptor; parked
			// directions would never wake, so stop taking new ones
			// and wake every one parked now.
			p.mu.Lock()
			p.broken = true
			woken := p.parked
			p.parked = map[uint64]*direction{}
			p.mu.Unlock()
			for _, d := range woken {
				go d.resume()
			}
			return
		}
		for _, ev := range events[:n] {
			ticket := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			p.mu.Lock()
			d, ok := p.parked[ticket]
			delete(p.parked, ticket)
			p.mu.Unlock()
			if ok {
				// The next idle deadline is set here, on this
				// goroutine's stack, not the relay's (spliceRelay).
				_ = d.src.SetReadDeadline(time.Now().Add(d.t.idleAfter))
				go d.resume()
			}
		}
	}
}
