package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"time"
)

// The floor proxy answers one question with a measurement: what is the
// least CPU a Go forward proxy with one goroutine per client connection
// spends per plain keep-alive request on this machine, and per new CONNECT
// tunnel? It is the gateway's
// request path with everything but the system calls taken out: no
// parsing beyond finding the end of the head and Content-Length, no
// allocation per request, one dedicated upstream connection per client
// connection, no leases, no checks; a tunnel is a CONNECT passed to the
// upstream, its answer passed back, and splice(2) both ways. It is not a
// proxy anyone should run (no validation, GET without a body or CONNECT
// only); it runs only in the bench.
//
// Whatever the gateway's front end is (net/http, its own loop, or a
// library such as fasthttp, which makes the same system calls from the
// same runtime), it costs this at best: the fasthttp reference measures
// about the same, and only the epoll relay, off the runtime's netpoller,
// costs less (references.go).

// floorEnv, when set, makes the bench binary run as the floor proxy:
// "LISTEN-ADDR UPSTREAM-ADDR".
const floorEnv = "PROXYFLEET_BENCH_FLOOR"

// runFloorProxy serves until killed.
func runFloorProxy(listen, upstream string) error {
	return serveEach(listen, func(c net.Conn) { floorConn(c, upstream) })
}

func floorConn(c net.Conn, upstream string) {
	defer c.Close()
	cr := bufio.NewReaderSize(c, 4096)
	if b, err := cr.Peek(8); err == nil && string(b) == "CONNECT " {
		floorTunnel(c, cr, upstream)
		return
	}
	floorForward(c, cr, upstream)
}

// floorTunnel is the tunnel floor: CONNECT through the upstream, 200 to
// the client, then splice(2) both ways on two goroutines, as the gateway
// does, with nothing else.
func floorTunnel(c net.Conn, cr *bufio.Reader, upstream string) {
	up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	uw := bufio.NewWriterSize(up, 4096)
	if _, err := copyHead(uw, cr); err != nil || uw.Flush() != nil {
		return
	}
	ur := bufio.NewReaderSize(up, 4096)
	cw := bufio.NewWriterSize(c, 4096)
	if _, err := copyHead(cw, ur); err != nil || cw.Flush() != nil {
		return
	}
	if cr.Buffered() > 0 || ur.Buffered() > 0 {
		return // the bench's clients wait for the 200 before they speak
	}
	done := make(chan struct{})
	go func() {
		_, _ = up.(*net.TCPConn).ReadFrom(c)
		_ = up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = c.(*net.TCPConn).ReadFrom(up)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
}

func floorForward(c net.Conn, cr *bufio.Reader, upstream string) {
	up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	ur := bufio.NewReaderSize(up, 4096)
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
