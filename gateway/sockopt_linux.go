//go:build linux

package gateway

import (
	"net"
	"syscall"
)

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT (since 4.2).
const ipBindAddressNoPort = 24

// bindNoPort lets a dial bound to a source address leave the port choice
// to connect(2). Without it, bind(2) must find a port free for every
// destination, which gets slow and then fails once many connections from
// one source address sit in TIME_WAIT. Best effort: an old kernel that
// lacks the option just binds the classic way.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	return c.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
}

// idleUnusable reports whether an idle keep-alive connection must not be
// reused: its peer closed or reset it, or sent bytes nobody asked for (an
// unsolicited 408). One non-blocking MSG_PEEK; false when unsure.
func idleUnusable(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	unusable := false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		unusable = err != syscall.EAGAIN && err != syscall.EINTR
		return true
	})
	return unusable
}
