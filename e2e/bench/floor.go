package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// The floor proxy answers one question with a measurement: what is the
// least CPU a Go forward proxy with one goroutine per client connection
// spends per plain keep-alive request on this machine? It is the gateway's
// request path with everything but the system calls taken out: no
// parsing beyond finding the end of the head and Content-Length, no
// allocation per request, one dedicated upstream connection per client
// connection, no leases, no checks. It is not a proxy anyone should run
// (no validation, GET without a body only); it runs only in the bench.
//
// Whatever the gateway's front end is (net/http, its own loop, or a
// library such as fasthttp, which makes the same system calls from the
// same runtime), it cannot cost less than this, so the floor's CPU per
// request against Squid's says which goals a Go design can reach here.

// floorEnv, when set, makes the bench binary run as the floor proxy:
// "LISTEN-ADDR UPSTREAM-ADDR".
const floorEnv = "PROXYFLEET_BENCH_FLOOR"

// runFloorProxy serves until killed.
func runFloorProxy(spec string) error {
	var listen, upstream string
	if _, err := fmt.Sscan(spec, &listen, &upstream); err != nil {
		return fmt.Errorf("%s=%q: want \"LISTEN UPSTREAM\"", floorEnv, spec)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go floorConn(c, upstream)
	}
}

func floorConn(c net.Conn, upstream string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	cr, ur := bufio.NewReaderSize(c, 4096), bufio.NewReaderSize(up, 4096)
	cw, uw := bufio.NewWriterSize(c, 4096), bufio.NewWriterSize(up, 4096)
	for {
		if _, err := copyHead(uw, cr); err != nil {
			return
		}
		if uw.Flush() != nil {
			return
		}
		n, err := copyHead(cw, ur)
		if err != nil || n < 0 {
			return // no Content-Length: not something the floor forwards
		}
		if _, err := io.CopyN(cw, ur, n); err != nil {
			return
		}
		if cw.Flush() != nil {
			return
		}
	}
}

var contentLength = []byte("content-length:")

// copyHead copies one message head from r to w and returns its
// Content-Length, -1 without one (the bench's requests have no body, so
// only an answer's length is used).
func copyHead(w *bufio.Writer, r *bufio.Reader) (int64, error) {
	n := int64(-1)
	first := true
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if _, err := w.Write(line); err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			if first {
				return 0, errors.New("empty head")
			}
			return n, nil
		}
		first = false
		if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
			v := bytes.TrimSpace(line[len(contentLength):])
			if x, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				n = x
			}
		}
	}
}

// startFloorProxy runs this binary as the floor proxy in front of upstream.
func startFloorProxy(upstream string) (*testutil.Process, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	p, addrs, err := testutil.LaunchProcessOnFreePorts(self, 1, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name:      "floor-proxy",
			Env:       []string{floorEnv + "=" + addrs[0] + " " + upstream},
			WaitAddrs: addrs,
		}
	})
	if err != nil {
		return nil, "", err
	}
	return p, addrs[0], nil
}
