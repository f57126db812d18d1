//go:build linux

package keepalive

import (
	"net"
	"syscall"
)

// Unusable reports whether an idle keep-alive connection must not be
// reused: its peer closed or reset it, or sent bytes nobody asked for (an
// unsolicited 408). One non-blocking MSG_PEEK; false when unsure.
func Unusable(c net.Conn) bool {
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
