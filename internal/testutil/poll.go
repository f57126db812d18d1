// Package testutil holds the small parts nearly every integration and
// end-to-end test uses: Go target servers that report the source address
// they see (and echo WebSockets), clients that go through a proxy, the
// proxyfleet binary and other programs as child processes (and the port,
// output and stop helpers the launchers share), a network namespace of a
// test's own, and recorders of logs and output. Waiting for a condition is
// internal/testutil/poll's, which every test package can import; the
// helpers here wait with it.
//
// The real servers a test starts are not here: each has its package under
// internal/testkit (squid, redis, libvirtd, sshd, computeapi, fpsite,
// dnssink), which imports this one, so a test links only the parts it
// starts. testutil must therefore import none of them, and nothing beyond
// the standard library, internal/testutil/poll and go-logr: nearly every
// test package links it.
//
// Every Start* helper ties the part's lifetime to the test with t.Cleanup. The
// Launch* variants return errors instead, for programs such as e2e/bench that
// have no testing.TB.
package testutil

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago (it
// listens on port 0 and closes). Another process may take it before the caller
// binds it: callers retry on "address already in use", as squid.Start and
// StartProcessOnFreePorts do.
func FreeAddr() (string, error) { return FreeAddrOn("127.0.0.1") }

// FreeAddrOn is FreeAddr on another local IP (a 127.0.0.N, a Squid's
// ListenIP).
func FreeAddrOn(ip string) (string, error) {
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

// RefusedAddr is a loopback address that refuses every connection and
// stays so for the test: a TCP socket bound to a free port and never
// listening, closed at cleanup. A dial gets "connection refused", and no
// other process can take the port meanwhile, which an address FreeAddr
// found free cannot promise (a parallel test's server may listen there
// by the time it is dialled).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
