package main

import (
	"errors"
	"net/netip"
	"runtime"

	"golang.org/x/sys/unix"
)

// The epoll floor answers the question the goroutine floor (floor.go)
// leaves open: is the cost the floor pays above Squid's the system calls,
// which any proxy makes, or Go's runtime around them (parking and waking a
// goroutine at every blocking read, the netpoller, sysmon)? It is a byte
// relay on one locked OS thread with its own epoll set and non-blocking
// sockets, bypassing the runtime's netpoller, as Squid's own event loop
// does: a client connection is paired with a new connection to the
// upstream, and bytes are copied each way with read(2) and write(2). It
// parses nothing, so it serves keep-alive requests and CONNECT tunnels
// alike (the upstream answers both). It is not a proxy anyone should run;
// it runs only in the bench.

// epollFloorEnv, when set, makes the bench binary run as the epoll floor:
// "LISTEN-ADDR UPSTREAM-ADDR".
const epollFloorEnv = "PROXYFLEET_BENCH_EPOLL_FLOOR"

// relayEnd is one socket of a pair and what it still owes its peer.
type relayEnd struct {
	fd      int
	peer    *relayEnd
	pending []byte // read from this end, not yet written to peer
	eof     bool   // this end sent FIN
	closed  bool
}

// runEpollFloor serves until killed.
func runEpollFloor(listen, upstream string) error {
	la, err := netip.ParseAddrPort(listen)
	if err != nil {
		return err
	}
	ua, err := netip.ParseAddrPort(upstream)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(lfd, inet4(la)); err != nil {
		return err
	}
	if err := unix.Listen(lfd, 1024); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lfd)}); err != nil {
		return err
	}
	ends := map[int]*relayEnd{}
	buf := make([]byte, 64<<10)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				epollAccept(ep, lfd, inet4(ua), ends)
				continue
			}
			e := ends[fd]
			if e == nil || e.closed {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				// The peer's pending bytes can go out now.
				epollFlush(ep, e.peer, ends)
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) != 0 && !e.closed && !e.eof && len(e.pending) == 0 {
				epollRead(ep, e, buf, ends)
			}
		}
	}
}

// epollAccept pairs every waiting client with a new upstream connection.
// The upstream connect is blocking (on loopback it completes at once) and
// the socket turns non-blocking after it.
func epollAccept(ep, lfd int, upstream unix.Sockaddr, ends map[int]*relayEnd) {
	for {
		cfd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: none left
		}
		ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			unix.Close(cfd)
			continue
		}
		if err := unix.Connect(ufd, upstream); err != nil {
			unix.Close(cfd)
			unix.Close(ufd)
			continue
		}
		_ = unix.SetNonblock(ufd, true)
		_ = unix.SetsockoptInt(cfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		_ = unix.SetsockoptInt(ufd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c, u := &relayEnd{fd: cfd}, &relayEnd{fd: ufd}
		c.peer, u.peer = u, c
		ends[cfd], ends[ufd] = c, u
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, cfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(cfd)})
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ufd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ufd)})
	}
}

// epollRead copies what e has to its peer; what the peer cannot take yet
// is kept, e stops being read and the peer is watched for room.
func epollRead(ep int, e *relayEnd, buf []byte, ends map[int]*relayEnd) {
	n, err := unix.Read(e.fd, buf)
	switch {
	case errors.Is(err, unix.EAGAIN):
		return
	case err != nil:
		epollClose(e, ends)
		return
	case n == 0:
		e.eof = true
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, e.fd, &unix.EpollEvent{Events: 0, Fd: int32(e.fd)})
		_ = unix.Shutdown(e.peer.fd, unix.SHUT_WR)
		if e.peer.eof {
			epollClose(e, ends)
		}
		return
	}
	w, err := unix.Write(e.peer.fd, buf[:n])
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		epollClose(e, ends)
		return
	}
	w = max(w, 0)
	if w < n {
		e.pending = append(e.pending[:0], buf[w:n]...)
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, e.fd, &unix.EpollEvent{Events: 0, Fd: int32(e.fd)})
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, e.peer.fd, &unix.EpollEvent{Events: epollWants(e.peer) | unix.EPOLLOUT, Fd: int32(e.peer.fd)})
	}
}

// epollFlush writes src's pending bytes to its peer, and resumes reading
// src once they are all out.
func epollFlush(ep int, src *relayEnd, ends map[int]*relayEnd) {
	if len(src.pending) == 0 {
		return
	}
	w, err := unix.Write(src.peer.fd, src.pending)
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		epollClose(src, ends)
		return
	}
	src.pending = src.pending[max(w, 0):]
	if len(src.pending) > 0 {
		return
	}
	_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, src.peer.fd, &unix.EpollEvent{Events: epollWants(src.peer), Fd: int32(src.peer.fd)})
	_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, src.fd, &unix.EpollEvent{Events: epollWants(src), Fd: int32(src.fd)})
}

// epollWants is the read interest of e: none once it sent FIN or while
// its peer still owes bytes.
func epollWants(e *relayEnd) uint32 {
	if e.eof || len(e.pending) > 0 {
		return 0
	}
	return unix.EPOLLIN
}

// epollClose closes both sockets of e's pair.
func epollClose(e *relayEnd, ends map[int]*relayEnd) {
	for _, x := range []*relayEnd{e, e.peer} {
		if !x.closed {
			x.closed = true
			delete(ends, x.fd)
			unix.Close(x.fd) // closing removes it from the epoll set
		}
	}
}

// inet4 is addr as a socket address (the bench listens on 127.0.0.1 only).
func inet4(addr netip.AddrPort) unix.Sockaddr {
	return &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
}
