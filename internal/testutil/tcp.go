package testutil

import (
	"net"
	"testing"
)

// ServeTCP accepts on a free 127.0.0.1 port until the test ends and runs
// handle on a goroutine of its own for each connection (handle closes it);
// it returns the address. The raw servers tests script by hand (an
// upstream that answers CONNECT one way, an echo, a target that resets)
// are each this loop and their handle.
func ServeTCP(tb testing.TB, handle func(c net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}
