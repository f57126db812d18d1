// Package testutil starts the real parts the integration and end-to-end tests
// run against — Squid instances with their own egress addresses, Go target
// servers that report the source address they see, the proxyfleet binary as a
// child process. Waiting for a condition is internal/testutil/poll's, which
// every test package can import; the helpers here wait with it.
//
// Every Start* helper ties the part's lifetime to the test with t.Cleanup. The
// Launch* variants return errors instead, for programs such as e2e/bench that
// have no testing.TB.
package testutil

import (
	"errors"
	"net"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago (it
// listens on port 0 and closes). Another process may take it before the caller
// binds it: callers retry on "address already in use", as StartSquid and
// StartProcessOnFreePorts do.
func FreeAddr() (string, error) { return freeAddrOn("127.0.0.1") }

// freeAddrOn is FreeAddr on another local IP.
func freeAddrOn(ip string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", err
	}
	return addr, nil
}

// WaitListening polls until addr accepts a TCP connection or timeout passes.
func WaitListening(addr string, timeout time.Duration) error {
	return poll.Wait(timeout, "a listener on "+addr, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// errAddrInUse marks a start that failed because a port was taken; the
// starters retry with another port.
var errAddrInUse = errors.New("address already in use")
