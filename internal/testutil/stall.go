package testutil

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// HeldConn is a client connection to an HTTP server that sends nothing
// more: after a request head announcing a body of which it sent one byte
// (StallBody), or after one answered request (KeepIdle). It is how a
// client holds a server's connection, and a file descriptor, for as long
// as the server lets it.
type HeldConn struct {
	Conn net.Conn
	r    *bufio.Reader
	sent time.Time
}

// StallBody dials addr and sends method path with the header lines hdr
// ("Name: value"; a Content-Length among them replaces the 60000) and a
// partial body. The connection is closed when the
// test ends.
func StallBody(t testing.TB, addr, method, path string, hdr ...string) *HeldConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	head := method + " " + path + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	length := "Content-Length: 60000\r\n"
	for _, h := range hdr {
		if strings.HasPrefix(strings.ToLower(h), "content-length:") {
			length = ""
		}
		head += h + "\r\n"
	}
	head += length
	if _, err := io.WriteString(c, head+"\r\n{"); err != nil {
		t.Fatal(err)
	}
	return &HeldConn{Conn: c, r: bufio.NewReader(c), sent: time.Now()}
}

// KeepIdle dials addr, sends GET path, reads the answer and then keeps
// the connection open without another request.
func KeepIdle(t testing.TB, addr, path string) *HeldConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	h := &HeldConn{Conn: c, r: bufio.NewReader(c)}
	if _, _, err := h.Answer(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	h.sent = time.Now()
	return h
}

// Answer reads the server's answer and its body within timeout; an error
// when none came (the server waits for the body).
func (s *HeldConn) Answer(timeout time.Duration) (*http.Response, []byte, error) {
	_ = s.Conn.SetReadDeadline(time.Now().Add(timeout))
	resp, err := http.ReadResponse(s.r, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("no answer within %s: %w", timeout, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the answer's body: %w", err)
	}
	return resp, body, nil
}

// Closed waits up to timeout for the server to close the connection and
// returns how long after the client fell silent it did, or an error when
// it did not. What the server sends before it closes (its answer to a
// request it cut off) is read and dropped.
func (s *HeldConn) Closed(timeout time.Duration) (time.Duration, error) {
	_ = s.Conn.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.Copy(io.Discard, s.r)
	switch {
	case err == nil, errors.Is(err, net.ErrClosed):
		return time.Since(s.sent), nil
	case isTimeout(err):
		return 0, fmt.Errorf("the connection is still open %s after the client fell silent", timeout)
	default: // a reset is a close too
		return time.Since(s.sent), nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
