//go:build linux

package keepalive

import (
	"syscall"
	"unsafe"
)

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
		// Raw, as internal/rawio's reads and writes are: a runtime system
		// call here, once per reuse, would wake the runtime's monitor.
		_, _, err := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		unusable = err != syscall.EAGAIN && err != syscall.EINTR
		return true
	})
	return unusable
}
