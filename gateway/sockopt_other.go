//go:build !linux

package gateway

import (
	"net"
	"syscall"
)

// bindNoPort is a no-op where IP_BIND_ADDRESS_NO_PORT does not exist.
func bindNoPort(_, _ string, _ syscall.RawConn) error { return nil }

// idleUnusable cannot peek here; a closed connection shows when it is used.
func idleUnusable(net.Conn) bool { return false }
