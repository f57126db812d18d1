//go:build linux && race

package rawio

import "syscall"

// Under the race detector reads and writes go through package syscall,
// whose Read and Write tell the detector what a socket orders (a write
// happens before the read that sees its bytes) and that the kernel wrote
// p: with raw calls it would report races the socket rules out (a handler
// recording a request before it answers, read by the client after the
// answer came) and miss ones on p. Only the speed differs.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errno(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errno(err)
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
