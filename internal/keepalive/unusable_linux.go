//go:build linux

package keepalive

import "syscall"

// Unusable reports whether an idle keep-alive connection must not be
// reused: its peer closed or reset it, or sent bytes nobody asked for (an
// unsolicited 408). One non-blocking MSG_PEEK; false when unsure.
func (c *Conn) Unusable() bool {
	if c.raw == nil {
		return false
	}
	unusable := false
	var b [1]byte
	_ = c.raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		unusable = err != syscall.EAGAIN && err != syscall.EINTR
		return true
	})
	return unusable
}
