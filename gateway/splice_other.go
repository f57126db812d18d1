//go:build !linux

package gateway

import "net"

// pipePool is Linux's; elsewhere the relay is the standard library's.
type pipePool struct{}

// spliceRelay is (*TCPConn).ReadFrom where splice(2) does not exist.
func spliceRelay(_ *pipePool, dst, src *net.TCPConn) (int64, bool, error) {
	n, err := dst.ReadFrom(src)
	return n, true, err
}
