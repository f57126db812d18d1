//go:build !linux

package relay

import "net"

// pipePool is Linux's; elsewhere the relay is the standard library's.
type pipePool struct{}

// spliceRelay is (*TCPConn).ReadFrom where splice(2) does not exist; it
// never reports idle, as nothing parks a direction here (park_other.go).
func spliceRelay(_ *pipePool, dst, src *net.TCPConn, _ bool) (n int64, ok, idle bool, err error) {
	n, err = dst.ReadFrom(src)
	return n, true, false, err
}
