//go:build linux

package link

import (
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
