package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// getThroughTunnel sends a GET for host over an open tunnel and decodes
// the Target's answer.
func getThroughTunnel(t *testing.T, conn net.Conn, host string) testutil.TargetAnswer {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	defer conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "GET /tunnel HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a testutil.TargetAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConnectIsRetriedAfterARefusedUpstream(t *testing.T) {
	dead := deadUpstream(t)
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, dead, directMembers(1)[0])
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT answered %d; the client must not see the dead upstream", resp.StatusCode)
	}
	defer conn.Close()
	if resp.Header.Get(HeaderProxy) != "d2" || resp.Header.Get(HeaderLease) == "" {
		t.Fatalf("CONNECT 200 headers: %v", resp.Header)
	}
	if a := getThroughTunnel(t, conn, tg.Addr()); a.Source != "127.0.0.2" {
		t.Fatalf("tunnel reached the target from %s", a.Source)
	}
	if e.rec.failuresOf(dead.Name) != 1 {
		t.Fatalf("upstream failures of the dead member: %d", e.rec.failuresOf(dead.Name))
	}
	conn.Close()
	poll.Until(t, 20*time.Second, "the tunnel's bytes in both directions recorded", func() error {
		if e.rec.bytesOf(DirectionUp) == 0 || e.rec.bytesOf(DirectionDown) == 0 {
			return errors.New("tunnel bytes not recorded yet")
		}
		return nil
	})
}

func TestConnectToHTTPSTargetEndToEnd(t *testing.T) {
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(2)...)
	tg := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	c := testutil.MustProxyClient(t, "http://"+e.addr, tg.ClientTLSConfig())
	c.Transport.(*http.Transport).DisableKeepAlives = true
	sources := map[string]bool{}
	for i := 0; i < 4; i++ {
		resp, a := get(t, c, tg.URL()+"/tls", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		sources[a.Source] = true
	}
	if !sources["127.0.0.2"] || !sources["127.0.0.3"] {
		t.Fatalf("per-request CONNECTs did not rotate: %v", sources)
	}
	poll.Until(t, 20*time.Second, "the per-request tunnel leases released", func() error {
		if n := e.store.ActiveLeases(); n != 0 {
			return errors.New(strconv.Itoa(n) + " per-request tunnel leases still active")
		}
		return nil
	})
}

func TestConnectWithPipelinedBytesForwardsThem(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	// CONNECT and the first tunnelled request in one write, as optimistic clients do.
	msg := "CONNECT " + tg.Addr() + " HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n" +
		"GET /early HTTP/1.1\r\nHost: " + tg.Addr() + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, msg); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	inner, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a testutil.TargetAnswer
	if err := json.NewDecoder(inner.Body).Decode(&a); err != nil || a.Path != "/early" {
		t.Fatalf("pipelined request lost: %+v %v", a, err)
	}
}

func TestConnectWithNoMemberIs503(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	_, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), http.Header{HeaderProxy: {"nope"}}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get(HeaderReason) != "no_member" || !strings.Contains(b, "considered") {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
}

func TestConnectWhenEveryMemberFailsIs502(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, deadUpstream(t))
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	_, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(b, "a-dead") || !strings.Contains(b, "no other member") {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
}

// answeringUpstream is an upstream that answers every CONNECT with status.
func answeringUpstream(t *testing.T, name string, status int) (pool.Member, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	addr := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		n.Add(1)
		_, _ = io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+"\r\nContent-Length: 0\r\n\r\n")
	})
	return pool.Member{Name: name, URL: &url.URL{Scheme: "http", Host: addr}}, &n
}

func TestConnectAnswerRefusalsAreRetriedOnlyRetriesTimes(t *testing.T) {
	r1, n1 := answeringUpstream(t, "a1", http.StatusForbidden)
	r2, n2 := answeringUpstream(t, "a2", http.StatusServiceUnavailable)
	r3, n3 := answeringUpstream(t, "a3", http.StatusForbidden)
	e := newEnv(t, Options{Retries: 1, AllowPrivateTargets: true}, pool.StoreOptions{}, r1, r2, r3)
	_, resp, err := testutil.ConnectTunnel(e.addr, "127.0.0.1:9", nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(b, "answered CONNECT with") {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
	if got := n1.Load() + n2.Load() + n3.Load(); got != 2 {
		t.Fatalf("%d upstreams asked; want 2 (one try plus Retries=1)", got)
	}
}

func TestConnectAnswered407IsAMemberFailureRetriedElsewhere(t *testing.T) {
	bad, n := answeringUpstream(t, "a-badcreds", http.StatusProxyAuthRequired)
	e := newEnv(t, Options{Retries: 0, AllowPrivateTargets: true}, pool.StoreOptions{}, bad, directMembers(1)[0])
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || n.Load() != 1 {
		t.Fatalf("status %d after %d tries of the 407 member", resp.StatusCode, n.Load())
	}
	conn.Close()
}

// startSocks5 runs a minimal SOCKS5 server (RFC 1928/1929) that requires
// user/pass and connects to whatever it is asked. A stand-in for a real
// SOCKS upstream in this unit test of the client.
func startSocks5(t *testing.T, user, pass string) (string, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	serve := func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(br, hdr); err != nil || hdr[0] != 5 {
			return
		}
		methods := make([]byte, hdr[1])
		io.ReadFull(br, methods)
		if !strings.Contains(string(methods), "\x02") {
			c.Write([]byte{5, 0xff})
			return
		}
		c.Write([]byte{5, 2})
		io.ReadFull(br, hdr[:2])
		u := make([]byte, hdr[1])
		io.ReadFull(br, u)
		pl, _ := br.ReadByte()
		p := make([]byte, pl)
		io.ReadFull(br, p)
		if string(u) != user || string(p) != pass {
			c.Write([]byte{1, 1})
			return
		}
		c.Write([]byte{1, 0})
		req := make([]byte, 4)
		io.ReadFull(br, req)
		var host string
		switch req[3] {
		case 1:
			a := make([]byte, 4)
			io.ReadFull(br, a)
			host = net.IP(a).String()
		case 3:
			l, _ := br.ReadByte()
			h := make([]byte, l)
			io.ReadFull(br, h)
			host = string(h)
		default:
			return
		}
		pb := make([]byte, 2)
		io.ReadFull(br, pb)
		up, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(pb)))))
		if err != nil {
			c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
			return
		}
		defer up.Close()
		conns.Add(1)
		c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, 0, 0})
		go io.Copy(up, br)
		io.Copy(c, up)
	}
	return testutil.ServeTCP(t, serve), &conns
}

func TestSocks5MemberCarriesConnectAndPlainHTTP(t *testing.T) {
	addr, conns := startSocks5(t, "su", "sp")
	m := pool.Member{Name: "s5", URL: &url.URL{Scheme: "socks5", Host: addr, User: url.UserPassword("su", "sp")}}
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, m)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT via socks5: %v %v", resp, err)
	}
	getThroughTunnel(t, conn, tg.Addr())
	conn.Close()
	r2, _ := get(t, e.client("", ""), tg.URL()+"/plain", nil)
	if r2.StatusCode != 200 || r2.Header.Get(HeaderProxy) != "s5" {
		t.Fatalf("plain HTTP via socks5: %d %v", r2.StatusCode, r2.Header)
	}
	if conns.Load() != 2 {
		t.Fatalf("socks5 upstream carried %d connections, want 2", conns.Load())
	}

	bad := pool.Member{Name: "s5bad", URL: &url.URL{Scheme: "socks5", Host: addr, User: url.UserPassword("su", "wrong")}}
	e2 := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, bad)
	_, resp, err = testutil.ConnectTunnel(e2.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 502 || !strings.Contains(b, "SOCKS5 authentication refused") {
		t.Fatalf("bad socks credentials: %d %q", resp.StatusCode, b)
	}
}

func TestShutdownWaitsForAnOpenTunnel(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- e.gw.Shutdown(ctx)
	}()
	select {
	case err := <-e.served:
		if !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve returned %v, want http.ErrServerClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v while a tunnel was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	// The tunnel still works while the gateway drains.
	if a := getThroughTunnel(t, conn, tg.Addr()); a.Path != "/tunnel" {
		t.Fatalf("tunnel during shutdown: %+v", a)
	}
	conn.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return after the tunnel closed")
	}
}

func TestShutdownClosesTunnelsAtTheDeadline(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	conn, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 20*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.gw.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the deadline error", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || fault.IsTimeout(err) {
		t.Fatalf("tunnel still open after the forced shutdown: %v", err)
	}
	if n := e.gw.path.tunnels.Count(); n != 0 {
		t.Fatalf("%d tunnels still registered", n)
	}
}

func TestReadConnectAnswer(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		status  int
		wantErr string
	}{
		{name: "200 with headers", in: "HTTP/1.1 200 Connection established\r\nVia: x\r\n\r\n", status: 200},
		{name: "bare LF lines", in: "HTTP/1.0 200 OK\n\n", status: 200},
		{name: "interim 100 then 200", in: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", status: 200},
		{name: "status without reason", in: "HTTP/1.1 403\r\n\r\n", status: 403},
		{name: "refusal", in: "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 3\r\n\r\nabc", status: 503},
		{name: "not HTTP", in: "SSH-2.0-OpenSSH\r\n\r\n", wantErr: "malformed"},
		{name: "bad status", in: "HTTP/1.1 2x0 OK\r\n\r\n", wantErr: "malformed"},
		{name: "nothing", in: "", wantErr: "no answer"},
		{name: "truncated head", in: "HTTP/1.1 200 OK\r\nVia: x\r\n", wantErr: "truncated"},
		{name: "oversized head", in: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("a", 4000)+"\r\n", 20) + "\r\n", wantErr: "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, _, err := link.ReadConnectAnswer(bufio.NewReaderSize(strings.NewReader(tt.in), 4096))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %d %v, want error %q", status, err, tt.wantErr)
				}
				return
			}
			if err != nil || status != tt.status {
				t.Fatalf("got %d %v, want %d", status, err, tt.status)
			}
		})
	}
}

func TestDirectDialUsesTheCheckedAddressWithoutResolvingAgain(t *testing.T) {
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	var lookups atomic.Int32
	res := countingResolver{n: &lookups}
	g, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{}), Resolver: res, AllowPrivateTargets: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	mc, err := g.links.memberFor(directMembers(1)[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx := link.WithChecked(context.Background(), "site.example", []netip.Addr{mustAddr(t, tg.Host())})
	c, err := mc.Transport.DialContext(ctx, "tcp", "site.example:"+strconv.Itoa(tg.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if lookups.Load() != 0 {
		t.Fatal("the dial resolved the name again")
	}
	if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != "127.0.0.2" {
		t.Fatalf("dialled from %s, want the member's source 127.0.0.2", got)
	}
	// Without checked addresses the dial resolves (and checks) itself.
	c2, err := mc.Transport.DialContext(context.Background(), "tcp", "site.example:"+strconv.Itoa(tg.Port()))
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if lookups.Load() != 1 {
		t.Fatalf("%d lookups, want 1", lookups.Load())
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// countingResolver resolves every name to 127.0.0.1 and counts lookups.
type countingResolver struct{ n *atomic.Int32 }

func (r countingResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.n.Add(1)
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func TestTunnelPropagatesHalfClose(t *testing.T) {
	// The server reads until the client half-closes, then answers with what
	// it got and closes: the answer must still reach the client.
	target := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c)
		_, _ = io.WriteString(c, "got "+strconv.Itoa(len(b))+" bytes")
	})
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
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
	_, _ = io.WriteString(c, strings.Repeat("z", 100000))
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "got 100000 bytes" {
		t.Fatalf("answer after half-close: %q %v", got, err)
	}
	poll.Until(t, 20*time.Second, "the half-closed tunnel to end", func() error {
		if n := e.gw.path.tunnels.Count(); n != 0 {
			return errors.New(strconv.Itoa(n) + " tunnels still open")
		}
		return nil
	})
}

// publicResolver answers 192.0.2.1 (a documentation address, never dialled
// here) for ok.example and fails for anything else, counting lookups.
type publicResolver struct{ n *atomic.Int32 }

func (r publicResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.n.Add(1)
	if host == "ok.example" {
		return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestTargetLookupsAreCachedButFailuresAreNot(t *testing.T) {
	var n atomic.Int32
	g, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{}), Resolver: publicResolver{&n}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	for i := 0; i < 3; i++ {
		addrs, err := g.admit.CheckTarget(context.Background(), "ok.example", 443)
		if err != nil || len(addrs) != 1 || addrs[0].String() != "192.0.2.1" {
			t.Fatalf("checkTarget: %v %v", addrs, err)
		}
	}
	if n.Load() != 1 {
		t.Fatalf("%d lookups for three checks, want 1", n.Load())
	}
	for i := 0; i < 2; i++ {
		_, err := g.admit.CheckTarget(context.Background(), "gone.example", 443)
		var te *fault.Target
		if !errors.As(err, &te) || te.Reason != fault.ReasonDNS || !strings.Contains(te.Msg, "cannot resolve") {
			t.Fatalf("unresolvable target: %v", err)
		}
	}
	if n.Load() != 3 {
		t.Fatalf("%d lookups; a failed lookup must not be cached", n.Load())
	}
}

func TestDirectMemberWithAnUnusableSourceAddressFailsOver(t *testing.T) {
	gone := pool.Member{Name: "a-gone", SourceAddr: netip.MustParseAddr("192.0.2.1")} // not on this host: bind fails
	e := newEnv(t, Options{Retries: 1, AllowPrivateTargets: true}, pool.StoreOptions{}, gone, directMembers(1)[0])
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	resp, a := get(t, e.client("", ""), tg.URL(), nil)
	if resp.StatusCode != 200 || a.Source != "127.0.0.2" {
		t.Fatalf("GET: %d via %s", resp.StatusCode, a.Source)
	}
	if e.rec.failuresOf("a-gone") != 1 {
		t.Fatalf("failures of the member whose address is gone: %d", e.rec.failuresOf("a-gone"))
	}
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.23"})
	conn, cresp, err := testutil.ConnectTunnel(e.addr, other.Addr(), http.Header{HeaderSession: {"c"}}, 20*time.Second)
	if err != nil || cresp.StatusCode != 200 || cresp.Header.Get(HeaderProxy) != "d2" {
		t.Fatalf("CONNECT: %v %v", cresp, err)
	}
	conn.Close()
}

func TestADeadSiteTakesNoDirectMemberOutOfService(t *testing.T) {
	members := directMembers(2)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	c := e.client("", "")
	resp, err := c.Get("http://" + dead + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 502 || resp.Header.Get(HeaderReason) != "target_unreachable" {
		t.Fatalf("GET to a dead site: %d %q", resp.StatusCode, b)
	}
	_, cresp, err := testutil.ConnectTunnel(e.addr, dead, nil, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, cresp); cresp.StatusCode != 502 || cresp.Header.Get(HeaderReason) != "target_unreachable" {
		t.Fatalf("CONNECT to a dead site: %d %q", cresp.StatusCode, b)
	}
	for _, m := range members {
		if n := e.rec.failuresOf(m.Name); n != 0 {
			t.Fatalf("member %s counted %d failures for a dead site", m.Name, n)
		}
	}
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.24"})
	for i := 0; i < 4; i++ {
		get(t, c, tg.URL(), nil)
	}
	if len(tg.Sources()) != 2 {
		t.Fatalf("after a dead site, live traffic used only %v", tg.Sources())
	}
}

func TestReadConnectAnswerKeepsAFailuresErrorHeaders(t *testing.T) {
	in := "HTTP/1.1 503 Service Unavailable\r\nServer: squid/5.7\r\nx-squid-error: ERR_CONNECT_FAIL 111\r\n" +
		"Proxy-Status: sq; error=connection_refused\r\nX-Brd-Err-Code: client_1\r\n\r\n"
	status, _, ue, err := link.ReadConnectAnswer(bufio.NewReaderSize(strings.NewReader(in), 4096))
	if err != nil || status != 503 {
		t.Fatalf("got %d %v", status, err)
	}
	want := rotation.UpstreamError{SquidError: "ERR_CONNECT_FAIL 111", ProxyStatus: "sq; error=connection_refused", BrightDataCode: "client_1"}
	if ue != want {
		t.Fatalf("error headers %+v, want %+v", ue, want)
	}
	// A tunnel's headers are not read into anything.
	_, _, ue, _ = link.ReadConnectAnswer(bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nX-Squid-Error: ERR_X 0\r\n\r\n"), 4096))
	if ue != (rotation.UpstreamError{}) {
		t.Fatalf("2xx answer kept %+v", ue)
	}
}

// Inside a tunnel the gateway reads as plain HTTP, an absolute URI names
// the tunnel's site or is a 400: another port of the same host is another
// site (it was sent to the tunnel's port with the other port's Host).
func TestARequestInsideAnHTTPTunnelGoesToItsSiteOnly(t *testing.T) {
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	e := newEnv(t, Options{AllowPrivateTargets: true, ConnectHTTPPorts: []uint16{uint16(tg.Port())}}, pool.StoreOptions{}, directMembers(1)...)
	c, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), nil, 10*time.Second)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for _, tc := range []struct {
		uri    string
		status int
	}{
		{"http://" + tg.Addr() + "/same", http.StatusOK},
		{"/origin-form", http.StatusOK},
		{"http://" + net.JoinHostPort(tg.Host(), strconv.Itoa(tg.Port()+1)) + "/other-port", http.StatusBadRequest},
		{"http://127.0.0.250:" + strconv.Itoa(tg.Port()) + "/other-host", http.StatusBadRequest},
	} {
		if _, err := io.WriteString(c, "GET "+tc.uri+" HTTP/1.1\r\nHost: "+tg.Addr()+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.uri, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.uri, resp.StatusCode, tc.status)
		}
		if resp.Close {
			// A 400 may end the connection: the rest needs a new tunnel.
			break
		}
	}
	if n := tg.Total(); n != 2 {
		t.Errorf("the site saw %d requests, want the 2 for it", n)
	}
}
