package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// benchGateway serves a gateway with one direct member on 127.0.0.1.
func benchGateway(tb testing.TB, mode rotation.Mode) string {
	tb.Helper()
	return benchGatewayWith(tb, Options{Mode: mode})
}

// benchGatewayWith serves a gateway with o (its Pool one direct member,
// private targets allowed) on 127.0.0.1.
func benchGatewayWith(tb testing.TB, o Options) string {
	tb.Helper()
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers(directMembers(1))
	o.Pool, o.AllowPrivateTargets = store, true
	g, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	addr, _ := serveGateway(tb, g)
	return addr
}

var benchBody = []byte("hello from the target\n")

func benchHandler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(benchBody)
}

// benchTarget is a minimal keep-alive HTTP target.
func benchTarget(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(benchHandler)}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

func benchGet(b *testing.B, c *http.Client, u string) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		getOnce(b, c, u)
	}
}

// getOnce is one GET of u, its body read to the end: one op of the
// request benchmarks and of TestAllocationBudgets.
func getOnce(tb testing.TB, c *http.Client, u string) {
	resp, err := c.Get(u)
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		tb.Fatalf("status %d", resp.StatusCode)
	}
}

func benchClient(proxy string) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	if proxy != "" {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: proxy})
	}
	return &http.Client{Transport: tr}
}

// BenchmarkPlainHTTP is one keep-alive GET client → gateway → target per op
// (everything in this process; compare with BenchmarkPlainHTTPBaseline, the
// same client → target without the gateway, for the gateway's share).
func BenchmarkPlainHTTP(b *testing.B) {
	for _, mode := range []rotation.Mode{rotation.ModeSticky, rotation.ModeRequest} {
		b.Run(string(mode), func(b *testing.B) {
			target := benchTarget(b)
			c := benchClient(benchGateway(b, mode))
			defer c.CloseIdleConnections()
			benchGet(b, c, target)
		})
	}
}

// BenchmarkPlainHTTPBaseline is BenchmarkPlainHTTP without the gateway.
func BenchmarkPlainHTTPBaseline(b *testing.B) {
	target := benchTarget(b)
	c := benchClient("")
	defer c.CloseIdleConnections()
	benchGet(b, c, target)
}

// BenchmarkIdleTunnelMemory opens idle CONNECT tunnels through the gateway
// to a TCP sink and reports the gateway's heap+stack per tunnel: the same
// number of direct client → sink connections is measured first and
// subtracted, so client and sink costs cancel out.
func BenchmarkIdleTunnelMemory(b *testing.B) {
	const n = 500
	sinkLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sinkLn.Close()
	go func() {
		for {
			c, err := sinkLn.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	sink := sinkLn.Addr().String()
	gw := benchGateway(b, rotation.ModeSticky)

	inUse := func() (heap, stack float64) {
		var ms runtime.MemStats
		for i := 0; i < 3; i++ {
			runtime.GC()
		}
		time.Sleep(50 * time.Millisecond)
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapInuse), float64(ms.StackInuse)
	}
	open := func(through bool) []net.Conn {
		conns := make([]net.Conn, 0, n)
		for i := 0; i < n; i++ {
			if !through {
				c, err := net.Dial("tcp", sink)
				if err != nil {
					b.Fatal(err)
				}
				conns = append(conns, c)
				continue
			}
			c, err := net.Dial("tcp", gw)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.WriteString(c, "CONNECT "+sink+" HTTP/1.1\r\nHost: "+sink+"\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("CONNECT: %v %v", resp, err)
			}
			conns = append(conns, c)
		}
		return conns
	}
	closeAll := func(cs []net.Conn) {
		for _, c := range cs {
			c.Close()
		}
	}
	var heap, stack float64
	for i := 0; i < b.N; i++ {
		h0, s0 := inUse()
		direct := open(false)
		h1, s1 := inUse()
		closeAll(direct)
		time.Sleep(100 * time.Millisecond)
		h2, s2 := inUse()
		tunnels := open(true)
		h3, s3 := inUse()
		closeAll(tunnels)
		time.Sleep(100 * time.Millisecond)
		heap = ((h3 - h2) - (h1 - h0)) / n
		stack = ((s3 - s2) - (s1 - s0)) / n
	}
	// Heap and goroutine stacks apart: the stacks are the relays'.
	b.ReportMetric(heap+stack, "gw-bytes/tunnel")
	b.ReportMetric(heap, "gw-heap-bytes/tunnel")
	b.ReportMetric(stack, "gw-stack-bytes/tunnel")
}

// echoServer echoes every connection until it closes.
func echoServer(tb testing.TB) string {
	tb.Helper()
	return testutil.ServeTCP(tb, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
}

// BenchmarkConnectTunnel is one new tunnel per op: CONNECT through the
// gateway (direct member) to an echo server, one round trip, close.
func BenchmarkConnectTunnel(b *testing.B) {
	echo := echoServer(b)
	gw := benchGateway(b, rotation.ModeSticky)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tunnelOnce(b, gw, echo)
	}
}

// tunnelOnce is one CONNECT through gw to the echo server at echo, one
// byte echoed, closed: one op of BenchmarkConnectTunnel and of
// TestAllocationBudgets.
func tunnelOnce(tb testing.TB, gw, echo string) {
	c, err := net.Dial("tcp", gw)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "CONNECT "+echo+" HTTP/1.1\r\nHost: "+echo+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		tb.Fatalf("CONNECT: %v %v", resp, err)
	}
	_, _ = c.Write([]byte{'x'})
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		tb.Fatalf("echo through the tunnel: %q %v", b, err)
	}
}

// mitmBench is a gateway intercepting CONNECT (the site-facing handshake
// fp, a direct member) in front of a minimal keep-alive HTTPS target, and a
// client that trusts the gateway's CA: each GET of the URL is one MITM'd
// request on a kept tunnel. The first is sent here, and checked to carry
// the gateway's certificate.
func mitmBench(tb testing.TB, fp Fingerprint) (*http.Client, string) {
	tb.Helper()
	ca, caRoots := newTestCA(tb)
	site := httptest.NewUnstartedServer(http.HandlerFunc(benchHandler))
	site.StartTLS()
	tb.Cleanup(site.Close)
	siteRoots := x509.NewCertPool()
	siteRoots.AddCert(site.Certificate())
	gw := benchGatewayWith(tb, Options{Mode: rotation.ModeSticky, SiteRoots: siteRoots, MITM: &MITMOptions{CA: ca, Fingerprint: fp}})
	c := benchClient(gw)
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: caRoots, MinVersion: tls.VersionTLS12}
	tb.Cleanup(c.CloseIdleConnections)
	resp, err := c.Get(site.URL + "/")
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "proxyfleet test CA" {
		tb.Fatalf("the client's TLS was not the gateway's (MITM off?): %+v", resp.TLS)
	}
	return c, site.URL + "/"
}

// BenchmarkMITMRequest is one keep-alive GET client → gateway (MITM) →
// HTTPS target per op, on one tunnel: the gateway ends the client's TLS,
// reads the request and sends it over its own TLS to the site.
func BenchmarkMITMRequest(b *testing.B) {
	c, u := mitmBench(b, FingerprintMirror)
	benchGet(b, c, u)
}

// BenchmarkMITMNewTunnel is one GET per op on a new tunnel: CONNECT, the
// client's TLS handshake with the gateway, the gateway's with the site
// (mirrored, or Go's own hello), one request: what a crawler without
// keep-alive costs the gateway under MITM.
func BenchmarkMITMNewTunnel(b *testing.B) {
	for _, fp := range []Fingerprint{FingerprintMirror, FingerprintGo} {
		b.Run(string(fp), func(b *testing.B) {
			c, u := mitmBench(b, fp)
			c.Transport.(*http.Transport).DisableKeepAlives = true
			benchGet(b, c, u)
		})
	}
}

// BenchmarkPlainHTTPThroughUpstream is one keep-alive GET client → gateway
// → http:// upstream → target per op: the lean forwarding path. The
// upstream is a second gateway with a direct member.
func BenchmarkPlainHTTPThroughUpstream(b *testing.B) {
	c, target := throughUpstream(b)
	benchGet(b, c, target)
}

// throughUpstream serves a gateway whose one member is an http:// upstream
// (a second gateway, with a direct member) and returns a client of it and
// a target: the lean path's setup for its benchmark and allocation budget.
func throughUpstream(tb testing.TB) (*http.Client, string) {
	target := benchTarget(tb)
	upstream := benchGateway(tb, rotation.ModeSticky)
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{{Name: "up", URL: &url.URL{Scheme: "http", Host: upstream}}})
	g, err := New(Options{Pool: store, AllowPrivateTargets: true})
	if err != nil {
		tb.Fatal(err)
	}
	addr, _ := serveGateway(tb, g)
	c := benchClient(addr)
	tb.Cleanup(c.CloseIdleConnections)
	return c, target
}

// BenchmarkSessionMemory sends one plain GET for each of n distinct
// sticky sessions over one keep-alive connection (a crawler that names a
// session per account or page) and reports the heap that stays in use per
// live session: the pin, the lease and whatever else a session costs the
// gateway and its in-process store until the lease TTL ends.
func BenchmarkSessionMemory(b *testing.B) {
	const n = 30_000
	target := strings.TrimPrefix(strings.TrimSuffix(benchTarget(b), "/"), "http://")
	gw := benchGateway(b, rotation.ModeSticky)
	c, err := net.Dial("tcp", gw)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	send := func(i int) {
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n%s: s%d\r\n\r\n", target, target, HeaderSession, i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("session %d: status %d", i, resp.StatusCode)
		}
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	for i := range 100 { // warm: connections, buffers, code paths
		send(-1 - i)
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		before := heap()
		for i := range n {
			send(it*n + i)
		}
		after := heap()
		b.ReportMetric(float64(after-before)/n, "B/session")
	}
}
