//go:build linux

package gateway

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/relay"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// echoTarget echoes every connection with plain read/write: io.Copy between
// two TCP connections would splice, and the echo's own pipes would count as
// the gateway's in the descriptor tests.
func echoTarget(t *testing.T) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = c.(*net.TCPConn).CloseWrite()
				}
				return
			}
		}
	})
}

// openPipes counts this process's pipe descriptors.
func openPipes(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}

// echoOnce sends msg through c and reads it back.
func echoOnce(c net.Conn, msg []byte) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo: got %q, want %q", got, msg)
	}
	return nil
}

// TestIdleTunnelsHoldOnlyTheirSockets pins what an idle tunnel costs in
// descriptors: its two sockets, no pipe. The standard library's splice
// holds a pipe pair per direction while it waits (four descriptors more per
// tunnel, 160 here), which at tens of thousands of tunnels exhausts the
// descriptor limit long before memory.
func TestIdleTunnelsHoldOnlyTheirSockets(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	target := echoTarget(t)
	before := openPipes(t)
	const tunnels = 40
	for i := 0; i < tunnels; i++ {
		c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT %d: %v %v", i, resp, err)
		}
		t.Cleanup(func() { c.Close() })
		// Bytes both ways, so each direction has spliced and gone back
		// to waiting.
		if err := echoOnce(c, []byte(fmt.Sprintf("tunnel %d\n", i))); err != nil {
			t.Fatalf("tunnel %d: %v", i, err)
		}
	}
	poll.Until(t, 20*time.Second, "idle tunnels to hold no pipe beyond the pool's", func() error {
		if held := openPipes(t) - before; held > 2*relay.MaxIdlePipes {
			return fmt.Errorf("%d pipe descriptors open for %d idle tunnels (the pool keeps at most %d)", held, tunnels, 2*relay.MaxIdlePipes)
		}
		return nil
	})
	if n := e.gw.path.tunnels.Count(); n != tunnels {
		t.Fatalf("%d tunnels open, want %d", n, tunnels)
	}
}

// TestSplicedTunnelCarriesBurstsAndBulkBothWays: bursts with idle gaps in
// between (each wake-up takes a pipe and gives it back), then 8 MiB each
// way at once, byte for byte.
func TestSplicedTunnelCarriesBurstsAndBulkBothWays(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	carryBurstsAndBulk(t, e, echoTarget(t))
}

// carryBurstsAndBulk sends bursts with idle gaps and then 8 MiB each way at
// once through one tunnel to the echo target, checking every byte.
func carryBurstsAndBulk(t *testing.T, e *env, target string) {
	t.Helper()
	c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		msg := make([]byte, 1+rng.IntN(200<<10))
		for j := range msg {
			msg[j] = byte(rng.Uint32())
		}
		if err := echoOnce(c, msg); err != nil {
			t.Fatalf("burst %d (%d bytes): %v", i, len(msg), err)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}

	const bulk = 8 << 20
	payload := make([]byte, bulk)
	for j := range payload {
		payload[j] = byte(rng.Uint32())
	}
	want := sha256.Sum256(payload)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, werr = c.Write(payload)
	}()
	h := sha256.New()
	if _, err := io.CopyN(h, c, bulk); err != nil {
		t.Fatalf("reading the echo of 8 MiB: %v", err)
	}
	wg.Wait()
	if werr != nil {
		t.Fatalf("writing 8 MiB: %v", werr)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the 8 MiB came back changed")
	}
}

// TestAPipeWithBytesLeftIsNeverReused: a destination that goes away while
// bytes are in the pipe must not hand those bytes to the next tunnel that
// takes a pipe from the pool.
func TestAPipeWithBytesLeftIsNeverReused(t *testing.T) {
	// A target that reads a little, then resets the connection, so the
	// gateway's splice into it fails with bytes still in the pipe.
	resetting := testutil.ServeTCP(t, func(c net.Conn) {
		_, _ = io.ReadFull(c, make([]byte, 1024))
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	for i := 0; i < 5; i++ {
		c, resp, err := testutil.ConnectTunnel(e.addr, resetting, nil, 20*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		junk := bytes.Repeat([]byte("STALE"), 1<<20)
		_, _ = c.Write(junk) // fails once the target resets
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	poll.Until(t, 20*time.Second, "the reset tunnels to end", func() error {
		if n := e.gw.path.tunnels.Count(); n != 0 {
			return fmt.Errorf("%d tunnels open", n)
		}
		return nil
	})
	target := echoTarget(t)
	for i := 0; i < 5; i++ {
		c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		msg := []byte(fmt.Sprintf("fresh tunnel %d", i))
		err = echoOnce(c, msg)
		c.Close()
		if err != nil {
			t.Fatalf("a new tunnel after the resets: %v", err)
		}
	}
}
