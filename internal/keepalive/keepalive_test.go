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

// TestDoReplacesAStaleConnectionOnlyWhenTheRequestMayBeResent: the peer
// answers once on its first connection and closes it on the next request;
// Do starts over on a fresh connection when replay allows, and reports the
// failure when replay is nil.
func TestDoReplacesAStaleConnectionOnlyWhenTheRequestMayBeResent(t *testing.T) {
	for _, tc := range []struct {
		name       string
		replay     func() error
		wantErr    bool
		wantDialed int
	}{
		{"a resendable request goes again on a fresh connection", func() error { return nil }, false, 2},
		{"a request that may not be resent fails", nil, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			dialed := make(chan int, 4)
			go func() {
				for n := 1; ; n++ {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					dialed <- n
					go func(first bool) {
						defer c.Close()
						b := make([]byte, 1)
						for i := 0; ; i++ {
							if _, err := c.Read(b); err != nil {
								return
							}
							if first && i == 1 {
								return // the second request on the first connection: dropped
							}
							_, _ = c.Write(b)
						}
					}(n == 1)
				}
			}()
			p := NewPool(ln.Addr().String(), Options{DialTimeout: 5 * time.Second})
			exchange := func(pc *Conn) (bool, error) {
				if _, err := pc.W.WriteString("x"); err != nil {
					return true, err
				}
				if err := pc.W.Flush(); err != nil {
					return true, err
				}
				if _, err := pc.R.ReadByte(); err != nil {
					return true, err // nothing of an answer arrived
				}
				p.Put(pc)
				return false, nil
			}
			if err := p.Do(t.Context(), tc.replay, exchange); err != nil {
				t.Fatalf("first exchange: %v", err)
			}
			err = p.Do(t.Context(), tc.replay, exchange)
			if (err != nil) != tc.wantErr {
				t.Fatalf("second exchange: err = %v, want error %v", err, tc.wantErr)
			}
			if got := len(dialed); got != tc.wantDialed {
				t.Fatalf("dialed %d connections, want %d", got, tc.wantDialed)
			}
		})
	}
}
