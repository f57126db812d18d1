package keepalive

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestPoolClosesIdleConnections pins when a pooled connection is closed:
// idle past the timeout (by the sweep), handed back after the final close,
// and every idle one on CloseIdle; none of them is handed out again.
func TestPoolClosesIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
				closed <- struct{}{}
			}()
		}
	}()
	tests := []struct {
		name   string
		idle   time.Duration
		action func(p *Pool, pc *Conn)
	}{
		{"an idle connection is closed after the idle timeout", 50 * time.Millisecond,
			func(p *Pool, pc *Conn) { p.Put(pc) }},
		{"a connection handed back after the final close is closed", time.Hour,
			func(p *Pool, pc *Conn) { p.CloseIdle(true); p.Put(pc) }},
		{"closing idle connections closes a pooled one", time.Hour,
			func(p *Pool, pc *Conn) { p.Put(pc); p.CloseIdle(false) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPool(ln.Addr().String(), Options{DialTimeout: time.Second, IdleTimeout: tc.idle})
			pc, err := p.Dial(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			tc.action(p, pc)
			select {
			case <-closed:
			case <-time.After(20 * time.Second):
				t.Fatal("the connection was not closed")
			}
			if got := p.Get(); got != nil {
				t.Fatal("a closed connection is still handed out")
			}
		})
	}
}
