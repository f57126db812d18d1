//go:build linux

package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pair is a connected loopback TCP pair: a (wrapped) and its peer.
func pair(t *testing.T) (a net.Conn, peer *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		got <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); p.Close() })
	a = Wrap(c)
	if _, ok := a.(*conn); !ok {
		t.Fatalf("Wrap of a TCP connection gave %T, not the raw conn", a)
	}
	return a, p.(*net.TCPConn)
}

func TestWrapMovesBytesBothWaysLikeNetConn(t *testing.T) {
	a, peer := pair(t)
	// More than the socket buffers hold, so writes come back short and
	// wait for the peer (EAGAIN, then the netpoller).
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<17) // 2 MiB
	done := make(chan error, 1)
	go func() {
		n, err := a.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the peer read other bytes than were written")
	}

	if _, err := peer.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := a.Read(buf)
	if err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if n, err := a.Read(nil); n != 0 || err != nil {
		t.Fatalf("an empty Read = %d, %v; want 0, nil", n, err)
	}
	_ = peer.CloseWrite()
	if n, err := a.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read after the peer ended = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestWrapServesConcurrentCallersAsNetConn(t *testing.T) {
	// net.Conn lets goroutines call Read (and Write) at once; each call's
	// bytes must be its own.
	a, peer := pair(t)
	const writers, per = 4, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte{byte('a' + w)}, 64)
			for range per {
				if _, err := a.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	got := make([]byte, writers*per*64)
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := 0; i < len(got); i += 64 {
		if !bytes.Equal(got[i:i+64], bytes.Repeat(got[i:i+1], 64)) {
			t.Fatalf("concurrent writes interleaved inside one write at byte %d", i)
		}
	}

	go func() {
		_, _ = peer.Write(bytes.Repeat([]byte("z"), 1<<16))
		_ = peer.CloseWrite() // the readers still waiting get io.EOF
	}()
	var total atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for total.Load() < 1<<16 {
				n, err := a.Read(buf)
				for _, b := range buf[:n] {
					if b != 'z' {
						t.Errorf("a concurrent read got %q", b)
						return
					}
				}
				total.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if total.Load() != 1<<16 { // more would mean a read counted twice
		t.Fatalf("concurrent reads got %d bytes of %d", total.Load(), 1<<16)
	}
}

func TestWrapHonoursDeadlinesAsNetConn(t *testing.T) {
	a, _ := pair(t)
	_ = a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := a.Read(make([]byte, 8))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline: %v; want a timeout", err)
	}
	if oe, ok := err.(*net.OpError); !ok || oe.Op != "read" {
		t.Fatalf("Read's error %#v is not a *net.OpError named read", err)
	}

	// The peer never reads: the write fills both buffers and waits.
	big := make([]byte, 64<<20)
	_ = a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := a.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= len(big) {
		t.Fatalf("Write past its deadline = %d, %v; want fewer bytes and a timeout", n, err)
	}
	if oe, ok := err.(*net.OpError); !ok || oe.Op != "write" {
		t.Fatalf("Write's error %#v is not a *net.OpError named write", err)
	}
}

func TestWrapEndsAReadWhenClosed(t *testing.T) {
	a, _ := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it wait in the netpoller
	_ = a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed connection: %v; want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a waiting Read")
	}
}

func TestWrapReportsAResetConnection(t *testing.T) {
	a, peer := pair(t)
	_ = peer.SetLinger(0) // close with RST
	_ = peer.Close()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if _, err = a.Write([]byte("x")); err != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write to a reset connection: %v; want ECONNRESET or EPIPE", err)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "write" {
		t.Fatalf("the error %v does not name the write system call", err)
	}
}

func TestWrapLeavesConnectionsWithoutADescriptor(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if got := Wrap(c1); got != c1 {
		t.Fatalf("Wrap(net.Pipe) = %T; want the connection itself", got)
	}
}

func TestWrapReadsAndWritesWithoutAllocating(t *testing.T) {
	a, peer := pair(t)
	msg := []byte("ping")
	buf := make([]byte, 16)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	// The peer's side is net's own (no allocation either); the wrapper's
	// method values are bound once, at Wrap.
	if allocs != 0 {
		t.Fatalf("a write and a read through the wrapper allocated %.1f times; want 0", allocs)
	}
}

func TestWrapKeepsItsSyscallConn(t *testing.T) {
	a, _ := pair(t)
	sc, ok := a.(syscall.Conn)
	if !ok {
		t.Fatal("the wrapper is not a syscall.Conn")
	}
	r1, _ := sc.SyscallConn()
	r2, _ := sc.SyscallConn()
	if r1 == nil || r1 != r2 {
		t.Fatal("SyscallConn is not the one made at Wrap")
	}
}
