package squid

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

func TestSquidProxiesPlainHTTPFromItsOutgoingAddress(t *testing.T) {
	t.Parallel()
	sq := Start(t, Options{Name: "plain", OutgoingAddr: "127.0.0.2"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	c := testutil.MustProxyClient(t, sq.URL(), nil)

	resp, ans, err := testutil.GetAnswer(c, target.URL()+"/hello", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s, want 200", resp.Status)
	}
	if ans.Source != "127.0.0.2" || resp.Header.Get(testutil.SeenSourceHeader) != "127.0.0.2" {
		t.Fatalf("target saw source %q (header %q), want 127.0.0.2", ans.Source, resp.Header.Get(testutil.SeenSourceHeader))
	}
	if ans.Path != "/hello" {
		t.Fatalf("path %q, want /hello", ans.Path)
	}
	if xc := resp.Header.Get("X-Cache"); !strings.Contains(xc, sq.Hostname()) {
		t.Fatalf("X-Cache %q does not name this squid (%s)", xc, sq.Hostname())
	}
	if got := target.Count("127.0.0.2"); got != 1 {
		t.Fatalf("target counted %d requests from 127.0.0.2, want 1", got)
	}
	if pid := sq.PID(); pid == 0 || !sq.Running() {
		t.Fatalf("squid not reported running (pid %d)", pid)
	}
}

func TestSquidTunnelsConnectToTLSTargetOnAnyPort(t *testing.T) {
	t.Parallel()
	sq := Start(t, Options{Name: "connect", OutgoingAddr: "127.0.0.3"})
	target := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.9"})

	t.Run("http.Client verifies the target certificate through the tunnel", func(t *testing.T) {
		c := testutil.MustProxyClient(t, sq.URL(), target.ClientTLSConfig())
		resp, ans, err := testutil.GetAnswer(c, target.URL()+"/secure", nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || resp.TLS == nil {
			t.Fatalf("status %s, TLS %v: want 200 over TLS", resp.Status, resp.TLS != nil)
		}
		if ans.Source != "127.0.0.3" {
			t.Fatalf("target saw %q, want 127.0.0.3", ans.Source)
		}
	})
	t.Run("ConnectTunnel returns a usable raw tunnel", func(t *testing.T) {
		conn, resp, err := testutil.ConnectTunnel(sq.Addr(), target.Addr(), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if conn == nil {
			t.Fatalf("CONNECT answered %s", resp.Status)
		}
		defer conn.Close()
		tc := tls.Client(conn, target.ClientTLSConfig())
		req, _ := http.NewRequest(http.MethodGet, target.URL()+"/raw", nil)
		if err := req.Write(tc); err != nil {
			t.Fatal(err)
		}
		got, err := http.ReadResponse(bufio.NewReader(tc), req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, got.Body)
		if got.Header.Get(testutil.SeenSourceHeader) != "127.0.0.3" {
			t.Fatalf("target saw %q through the raw tunnel, want 127.0.0.3", got.Header.Get(testutil.SeenSourceHeader))
		}
	})
}

func TestThreeSquidsShowThreeDistinctSources(t *testing.T) {
	t.Parallel()
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.8"})
	outs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	var opts []Options
	for _, out := range outs {
		opts = append(opts, Options{Name: "trio" + out[len(out)-1:], OutgoingAddr: out})
	}
	squids := StartAll(t, opts...)
	ports := map[string]bool{}
	for i, sq := range squids {
		ports[sq.Addr()] = true
		c := testutil.MustProxyClient(t, sq.URL(), nil)
		resp, ans, err := testutil.GetAnswer(c, target.URL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || ans.Source != outs[i] {
			t.Fatalf("squid %d: %s from %q, want 200 from %s", i, resp.Status, ans.Source, outs[i])
		}
	}
	if len(ports) != 3 {
		t.Fatalf("squids share ports: %v", ports)
	}
	if got := target.Sources(); strings.Join(got, ",") != strings.Join(outs, ",") {
		t.Fatalf("target saw sources %v, want %v", got, outs)
	}
}

func TestSquidRestartsOnTheSamePortAfterKillAndStop(t *testing.T) {
	t.Parallel()
	sq := Start(t, Options{Name: "restart", OutgoingAddr: "127.0.0.4"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	addr := sq.Addr()
	get := func() error {
		// A fresh client each time: a pooled connection to the dead Squid would hide the restart.
		c, err := testutil.ProxyClient(sq.URL(), nil)
		if err != nil {
			return err
		}
		defer c.CloseIdleConnections()
		_, ans, err := testutil.GetAnswer(c, target.URL(), nil)
		if err == nil && ans.Source != "127.0.0.4" {
			t.Fatalf("source %q, want 127.0.0.4", ans.Source)
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		down func()
	}{
		{"kill (crash) then start", sq.Kill},
		{"stop (SIGTERM) then start", sq.Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.down()
			if sq.Running() {
				t.Fatal("squid still running after going down")
			}
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Fatalf("%s still accepts connections after going down", addr)
			}
			if err := get(); err == nil {
				t.Fatal("request through a downed squid succeeded")
			}
			sq.Start()
			if sq.Addr() != addr {
				t.Fatalf("restarted on %s, want the same %s", sq.Addr(), addr)
			}
			if err := get(); err != nil {
				t.Fatalf("after restart: %v", err)
			}
		})
	}
}

func TestSquidStartRetriesWhenItsPortIsTaken(t *testing.T) {
	t.Parallel()
	sq := Start(t, Options{Name: "taken", OutgoingAddr: "127.0.0.5"})
	addr := sq.Addr()
	sq.Stop()
	// Someone else takes the port while Squid is down; Start on the same
	// port must wait for it rather than fail or proxy through the stranger.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(time.Second)
		ln.Close()
		close(released)
	}()
	sq.Start()
	select {
	case <-released:
	default:
		t.Fatal("Start returned while the port was still held by another listener")
	}
	if sq.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", sq.Addr(), addr)
	}
}

func TestSquidsShareAFixedPortOnDistinctListenIPs(t *testing.T) {
	t.Parallel()
	free, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(free)
	port, _ := strconv.Atoi(p)
	squids := StartAll(t,
		Options{Name: "pod-a", ListenIP: "127.0.0.31", Port: port, OutgoingAddr: "127.0.0.31"},
		Options{Name: "pod-b", ListenIP: "127.0.0.32", Port: port, OutgoingAddr: "127.0.0.32"},
	)
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	for i, want := range []string{"127.0.0.31:" + p, "127.0.0.32:" + p} {
		sq := squids[i]
		if sq.Addr() != want || sq.Port() != port {
			t.Fatalf("squid %d listens on %s, want %s", i, sq.Addr(), want)
		}
		c := testutil.MustProxyClient(t, sq.URL(), nil)
		_, ans, err := testutil.GetAnswer(c, target.URL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if ans.Source != sq.OutgoingAddr() {
			t.Fatalf("squid %s: target saw %s, want %s", sq.Name(), ans.Source, sq.OutgoingAddr())
		}
	}
}

func TestSquidOptionsAreValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"outgoing address off loopback", Options{OutgoingAddr: "10.0.0.1"}},
		{"listen IP off loopback", Options{ListenIP: "192.168.1.1"}},
		{"IPv6 listen IP", Options{ListenIP: "::1"}},
		{"port out of range", Options{Port: 70000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := Launch(tc.opts); err == nil {
				s.Close()
				t.Fatalf("Launch(%+v) started", tc.opts)
			}
		})
	}
}

func TestSquidWithBasicAuthDemandsItsLogin(t *testing.T) {
	t.Parallel()
	login := &Login{Username: "crawler", Password: "pw-" + ServiceName()}
	sq := Start(t, Options{Name: "auth", OutgoingAddr: "127.0.0.3", BasicAuth: login})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	get := func(proxy string) int {
		t.Helper()
		resp, err := testutil.MustProxyClient(t, proxy, nil).Get(target.URL() + "/auth")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(sq.URL()); code != http.StatusProxyAuthRequired {
		t.Fatalf("without a login: %d, want 407", code)
	}
	wrong := strings.Replace(sq.LoginURL(), login.Password, "wrong", 1)
	if code := get(wrong); code != http.StatusProxyAuthRequired {
		t.Fatalf("with a wrong password: %d, want 407", code)
	}
	if code := get(sq.LoginURL()); code != http.StatusOK {
		t.Fatalf("with the login: %d, want 200", code)
	}
	if n := target.Count("127.0.0.3"); n != 1 {
		t.Fatalf("target saw %d requests from the Squid, want 1: only the logged-in one may pass", n)
	}

	// A new login takes effect on the next start; the old one is refused.
	sq.Stop()
	next := &Login{Username: "crawler", Password: "rotated-" + ServiceName()}
	sq.SetBasicAuth(next)
	sq.Start()
	if code := get(wrong); code != http.StatusProxyAuthRequired {
		t.Fatalf("after rotation, a wrong password: %d, want 407", code)
	}
	if code := get(sq.LoginURL()); code != http.StatusOK || !strings.Contains(sq.LoginURL(), next.Password) {
		t.Fatalf("after rotation, the new login: %d, want 200", code)
	}
}
