//go:build !linux

package keepalive

import "net"

// Unusable cannot peek here; a closed connection shows when it is used.
func Unusable(net.Conn) bool { return false }
