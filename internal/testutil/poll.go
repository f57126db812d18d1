// Package testutil starts the real parts the integration and end-to-end tests
// run against — Squid instances with their own egress addresses, Go target
// servers that report the source address they see, the proxyfleet binary as a
// child process — and small helpers to poll for conditions instead of sleeping.
//
// Every Start* helper ties the part's lifetime to the test with t.Cleanup. The
// Launch* variants return errors instead, for programs such as e2e/bench that
// have no testing.TB.
package testutil

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

// pollInterval is how often Eventually and Poll re-check a condition.
const pollInterval = 25 * time.Millisecond

// Poll calls fn until it returns nil or timeout passes, and returns the last
// error wrapped with how long it waited. It never sleeps after a success.
func Poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met within %s: %w", timeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// Eventually fails the test unless fn returns nil within timeout; the failure
// message carries fn's last error, so it says what was still wrong.
func Eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	if err := Poll(timeout, fn); err != nil {
		t.Fatal(err)
	}
}

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
	return Poll(timeout, func() error {
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
