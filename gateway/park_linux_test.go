//go:build linux

package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestIdleTunnelsHoldNoGoroutine pins what parking is for: once idle, a
// tunnel's two relay goroutines are gone, and a parked tunnel still carries
// bytes both ways the moment either side sends, as often as it parks.
func TestIdleTunnelsHoldNoGoroutine(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, TunnelIdleAfter: 50 * time.Millisecond}, pool.StoreOptions{}, directMembers(1)...)
	target := echoTarget(t)
	const tunnels = 40
	before := runtime.NumGoroutine()
	var conns []net.Conn
	for i := 0; i < tunnels; i++ {
		c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT %d: %v %v", i, resp, err)
		}
		conns = append(conns, c)
	}
	for round := 0; round < 3; round++ {
		for i, c := range conns {
			if err := echoOnce(c, []byte(fmt.Sprintf("round %d tunnel %d\n", round, i))); err != nil {
				t.Fatalf("round %d, tunnel %d: %v", round, i, err)
			}
		}
		// The echo target holds a goroutine per connection; the gateway,
		// once its tunnels are parked, none.
		poll.Until(t, 20*time.Second, "the idle tunnels' relays to park", func() error {
			if n := runtime.NumGoroutine() - before; n > tunnels+5 {
				return fmt.Errorf("%d goroutines more than before %d tunnels (the echo target's are %d)", n, tunnels, tunnels)
			}
			return nil
		})
	}
	for _, c := range conns {
		c.Close()
	}
	poll.Until(t, 20*time.Second, "the parked tunnels to end when their clients leave", func() error {
		if n := e.gw.path.tunnels.Count(); n != 0 {
			return fmt.Errorf("%d tunnels open", n)
		}
		return nil
	})
}

// TestTunnelsParkedEveryMillisecondLoseNothing: with a parking threshold of
// a millisecond, nearly every pause parks a direction; bursts and 8 MiB
// each way still arrive byte for byte.
func TestTunnelsParkedEveryMillisecondLoseNothing(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, TunnelIdleAfter: time.Millisecond}, pool.StoreOptions{}, directMembers(1)...)
	carryBurstsAndBulk(t, e, echoTarget(t))
}

// TestAHalfClosedTunnelAnswersAfterParking: the client half-closes, the
// target answers only after the client's direction has ended and the
// target's has been idle long enough to park; the answer still arrives
// and the tunnel then ends.
func TestAHalfClosedTunnelAnswersAfterParking(t *testing.T) {
	target := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c)
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(c, fmt.Sprintf("got %d bytes", len(b)))
	})
	e := newEnv(t, Options{AllowPrivateTargets: true, TunnelIdleAfter: 20 * time.Millisecond}, pool.StoreOptions{}, directMembers(1)...)
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	_, _ = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	time.Sleep(100 * time.Millisecond) // both directions park
	_, _ = io.WriteString(c, strings.Repeat("z", 100000))
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "got 100000 bytes" {
		t.Fatalf("answer after half-close and parking: %q %v", got, err)
	}
	poll.Until(t, 20*time.Second, "the half-closed tunnel to end", func() error {
		if n := e.gw.path.tunnels.Count(); n != 0 {
			return fmt.Errorf("%d tunnels open", n)
		}
		return nil
	})
}

// TestShutdownClosesParkedTunnels: a forced shutdown closes tunnels whose
// directions are parked (no goroutine would otherwise notice), and each
// one is counted as ended.
func TestShutdownClosesParkedTunnels(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, TunnelIdleAfter: 20 * time.Millisecond}, pool.StoreOptions{}, directMembers(1)...)
	target := echoTarget(t)
	var conns []net.Conn
	for i := 0; i < 5; i++ {
		c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		defer c.Close()
		if err := echoOnce(c, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond) // parked
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := e.gw.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the deadline error", err)
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || fault.IsTimeout(err) {
			t.Fatalf("tunnel %d still open after the forced shutdown: %v", i, err)
		}
	}
	poll.Until(t, 20*time.Second, "the parked tunnels to end", func() error {
		if n := e.gw.path.tunnels.Count(); n != 0 {
			return fmt.Errorf("%d tunnels still registered", n)
		}
		return nil
	})
}
