package leaseapi_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// rawAPI is a lease API stand-in on a bare TCP listener, so a test decides
// per connection and per request what goes back on the wire: an answer,
// an answer that closes, a close without an answer, or nothing at all.
type rawAPI struct {
	ln     net.Listener
	script func(conn, req int) string // the answer; "" closes without one; "hang" never answers

	mu     sync.Mutex
	conns  int
	bodies []string
}

const (
	answerOK    = "HTTP/1.1 204 No Content\r\n\r\n"
	answerClose = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
)

func startRawAPI(t *testing.T, script func(conn, req int) string) *rawAPI {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rawAPI{ln: ln, script: script}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns++
			n := a.conns
			a.mu.Unlock()
			go a.serve(c, n)
		}
	}()
	return a
}

func (a *rawAPI) serve(c net.Conn, conn int) {
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 1; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		a.mu.Lock()
		a.bodies = append(a.bodies, string(b))
		a.mu.Unlock()
		switch answer := a.script(conn, i); answer {
		case "":
			return
		case "hang":
			_, _ = io.Copy(io.Discard, c)
			return
		default:
			if _, err := io.WriteString(c, answer); err != nil || answer == answerClose {
				return
			}
		}
	}
}

func (a *rawAPI) seen() (conns int, bodies []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns, append([]string(nil), a.bodies...)
}

// TestLeanClientKeepsConnectionsAndRecovers pins the client's own
// keep-alive exchange with an http:// lease API: what is reused, what is
// not, and how a call survives a connection the server dropped.
func TestLeanClientKeepsConnectionsAndRecovers(t *testing.T) {
	report := pool.Report{Result: rotation.ResultRateLimited, Target: "site.example"}
	for _, tc := range []struct {
		name      string
		script    func(conn, req int) string
		wantConns int
	}{
		{"calls share one kept-alive connection",
			func(int, int) string { return answerOK }, 1},
		{"an answer that says Connection: close is not reused",
			func(int, int) string { return answerClose }, 3},
		{"a connection the server drops before answering is replaced and the call sent again, body included",
			func(conn, req int) string {
				if conn == 1 && req == 2 {
					return ""
				}
				return answerOK
			}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := startRawAPI(t, tc.script)
			c, err := leaseapi.NewClient("http://"+api.ln.Addr().String(), "tok", nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := c.Report(context.Background(), "lease-1", report); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			conns, bodies := api.seen()
			if conns != tc.wantConns {
				t.Errorf("the server saw %d connections, want %d", conns, tc.wantConns)
			}
			for i, b := range bodies {
				if b != bodies[0] || b == "" {
					t.Errorf("request %d carried body %q, want the report %q every time", i+1, b, bodies[0])
				}
			}
		})
	}

	t.Run("a server that never answers is cut off by the context", func(t *testing.T) {
		api := startRawAPI(t, func(int, int) string { return "hang" })
		c, err := leaseapi.NewClient("http://"+api.ln.Addr().String(), "tok", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		err = c.Release(ctx, "lease-1")
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pool.ErrUnreachable) {
			t.Fatalf("err = %v, want the context's deadline as an ErrUnreachable", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("the call took %v after its context ended", d)
		}
	})
}
