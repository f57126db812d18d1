package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestGatewayWebSockets opens WebSockets through the real binary and real
// Squids to an echo server of the test's own: ws:// in the request line
// and in http:// form, a 403 to the handshake as a ban that moves it to
// another member, either side's close ending the other, and wss:// inside
// a MITM tunnel.
func TestGatewayWebSockets(t *testing.T) {
	bin := testutil.BuildBinary(t)

	t.Run("ws through Squids, a banned handshake moved to another member", func(t *testing.T) {
		t.Parallel()
		pair := startSquids(t, "ws", "127.0.0.201", "127.0.0.202")
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(pair), rotation: "per-request"})
		site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.203"})
		for _, scheme := range []string{"ws", "http"} {
			c, br, resp := openSocket(t, g.addr, scheme+"://"+site.Addr()+"/echo", true)
			for i := range 3 {
				msg := fmt.Sprintf("%s message %d", scheme, i)
				got, err := testutil.WebSocketEcho(c, br, msg)
				if err != nil || got != msg {
					t.Fatalf("%s echo %d through %s: %q, %v", scheme, i, resp.Header.Get(hdrProxy), got, err)
				}
			}
			c.Close()
		}
		// The first Squid's source is banned: the handshake through it is
		// answered 403, a ban, and goes on to the other Squid.
		site.SetRule(pair[0].OutgoingAddr(), http.StatusForbidden, nil)
		for range 2 {
			c, br, resp := openSocket(t, g.addr, "ws://"+site.Addr()+"/after-ban", true)
			if resp.Header.Get(hdrProxy) != pair[1].Addr() {
				t.Fatalf("the socket opened through %s, want %s (the other was banned)", resp.Header.Get(hdrProxy), pair[1].Addr())
			}
			if got, err := testutil.WebSocketEcho(c, br, "after a ban"); err != nil || got != "after a ban" {
				t.Fatalf("echo after the ban: %q, %v", got, err)
			}
			// The client's close ends the site's side, which ends ours.
			if err := testutil.WebSocketClose(c); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Fatalf("after the close, the socket did not end: %v", err)
			}
			c.Close()
		}
		wantInService(t, g, 2)
	})

	t.Run("wss inside a MITM tunnel", func(t *testing.T) {
		t.Parallel()
		one := startSquids(t, "wss", "127.0.0.204")
		caCert, caKey, roots := makeMITMCA(t, bin)
		site := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.205"})
		siteCA := filepath.Join(t.TempDir(), "site-ca.pem")
		writeFile(t, siteCA, string(site.CertPEM()))
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(one),
			args: []string{"--mitm-ca-cert", caCert, "--mitm-ca-key", caKey, "--upstream-ca-file", siteCA}})
		raw, resp, err := testutil.ConnectTunnel(g.addr, site.Addr(), nil, 30*time.Second)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		defer raw.Close()
		tc := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: site.Host()})
		_ = tc.SetDeadline(time.Now().Add(60 * time.Second))
		br, hs, err := testutil.WebSocketHandshake(tc, "http://"+site.Addr()+"/secure", false)
		if err != nil || hs.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("wss handshake inside MITM: %v %v", hs, err)
		}
		if tc.ConnectionState().PeerCertificates[0].Issuer.CommonName == site.Host() {
			t.Fatal("the client talked to the site's own certificate, not the MITM leaf")
		}
		for i := range 3 {
			msg := fmt.Sprintf("wss message %d", i)
			if got, err := testutil.WebSocketEcho(tc, br, msg); err != nil || got != msg {
				t.Fatalf("wss echo %d: %q, %v", i, got, err)
			}
		}
		if n := site.Count("127.0.0.204"); n != 1 {
			t.Fatalf("the site saw %d handshakes from the Squid, want 1", n)
		}
	})
}

// openSocket dials the gateway and opens a WebSocket for target, which
// must be answered 101.
func openSocket(t *testing.T, gateway, target string, proxyForm bool) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.DialTimeout("tcp", gateway, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	br, resp, err := testutil.WebSocketHandshake(c, target, proxyForm)
	if err != nil {
		c.Close()
		t.Fatalf("handshake for %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		t.Fatalf("handshake for %s: %s %s, want 101", target, resp.Status, strings.TrimSpace(resp.Header.Get(hdrReason)))
	}
	return c, br, resp
}

// makeMITMCA makes a MITM CA with the binary's own mitm-ca init and
// returns its files and a pool that trusts it.
func makeMITMCA(t *testing.T, bin string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if out, err := exec.Command(bin, "mitm-ca", "init", "--cert", certFile, "--key", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("mitm-ca init: %v\n%s", err, out)
	}
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemBytes) {
		t.Fatal("the MITM CA file holds no certificate")
	}
	return certFile, keyFile, roots
}

// TestWebSocketsAsBrowsersAndClientsOpenThem: a browser opens ws://
// through a proxy with CONNECT host:port, which Squids refuse for any port
// but 443, so the gateway answers a CONNECT to a --connect-http-ports port
// itself and sends the HTTP inside through a member. Headless Chromium and
// Python's aiohttp open ws:// and wss:// (inside MITM) through the real
// binary and a real Squid; a socket lives for a minute, and a gateway
// shutdown closes the sockets within its grace.
func TestWebSocketsAsBrowsersAndClientsOpenThem(t *testing.T) {
	bin := testutil.BuildBinary(t)

	t.Run("CONNECT to an HTTP port carries plain HTTP through the member", func(t *testing.T) {
		t.Parallel()
		// A Squid that tunnels only to 443, as the generated ones do.
		one := squid.StartAll(t, squid.Options{Name: "ws-connect", OutgoingAddr: "127.0.0.206",
			AccessFirst: []string{"acl tls_ports port 443", "http_access deny CONNECT !tls_ports"}})
		site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.207"})
		port := strconv.Itoa(site.Port())
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(one), args: []string{"--connect-http-ports", "80," + port}})

		raw, resp, err := testutil.ConnectTunnel(g.addr, site.Addr(), nil, 30*time.Second)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %s: %v %v", site.Addr(), resp, err)
		}
		defer raw.Close()
		br, hs, err := testutil.WebSocketHandshake(raw, "http://"+site.Addr()+"/browser", false)
		if err != nil || hs.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("handshake inside the CONNECT: %v %v\n%s", hs, err, tail(g.Output(), 20))
		}
		if got := hs.Header.Get(hdrProxy); got != one[0].Addr() {
			t.Fatalf("the socket's %s is %q, want the Squid %s", hdrProxy, got, one[0].Addr())
		}
		for i := range 3 {
			msg := fmt.Sprintf("through CONNECT %d", i)
			if got, err := testutil.WebSocketEcho(raw, br, msg); err != nil || got != msg {
				t.Fatalf("echo %d: %q, %v", i, got, err)
			}
		}
		// A plain GET in such a tunnel is a plain request through the member.
		raw2, _, err := testutil.ConnectTunnel(g.addr, site.Addr(), nil, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer raw2.Close()
		_ = raw2.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(raw2, "GET /inside HTTP/1.1\r\nHost: %s\r\n\r\n", site.Addr())
		get, err := http.ReadResponse(bufio.NewReader(raw2), nil)
		if err != nil || get.StatusCode != http.StatusOK || get.Header.Get(hdrProxy) != one[0].Addr() {
			t.Fatalf("GET inside the CONNECT: %v %v", get, err)
		}
		get.Body.Close()
		if n := site.Count(one[0].OutgoingAddr()); n != 2 {
			t.Fatalf("the site saw %d requests from the Squid, want 2 (the handshake and the GET)", n)
		}

		// With the port not listed, the CONNECT goes to the member, which
		// refuses a tunnel to a port other than 443: what a browser got.
		off := startGateway(t, bin, gwConfig{upstreams: squidURLs(one), args: []string{"--connect-http-ports="}})
		c, resp, err := testutil.ConnectTunnel(off.addr, site.Addr(), nil, 30*time.Second)
		if err == nil && resp.StatusCode == http.StatusOK {
			c.Close()
			t.Fatal("with --connect-http-ports empty the CONNECT was answered 200: the gateway still read it itself, or the Squid allows any port")
		}
		if resp == nil || resp.StatusCode < 400 {
			t.Fatalf("with --connect-http-ports empty: %v %v, want the Squid's refusal", resp, err)
		}
	})

	t.Run("a socket lives for a minute; a shutdown closes it within the grace", func(t *testing.T) {
		t.Parallel()
		one := startSquids(t, "ws-long", "127.0.0.206")
		site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.207"})
		// The later flag wins: a grace short enough to see it end the socket.
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(one), args: []string{"--shutdown-grace", "3s"}})
		c, br, _ := openSocket(t, g.addr, "ws://"+site.Addr()+"/long", true)
		defer c.Close()
		begun := time.Now()
		for i := 0; time.Since(begun) < time.Minute; i++ {
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			msg := fmt.Sprintf("after %s", time.Since(begun).Round(time.Second))
			if got, err := testutil.WebSocketEcho(c, br, msg); err != nil || got != msg {
				t.Fatalf("echo %q on a socket open %s: %q, %v", msg, time.Since(begun), got, err)
			}
			time.Sleep(10 * time.Second)
		}
		if err := g.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, br); err != nil {
			t.Fatalf("after SIGTERM the socket did not end: %v", err)
		}
		// The grace is 3s; the relays get up to a second more to unwind.
		if took := time.Since(stopped); took > 10*time.Second {
			t.Fatalf("the socket ended %s after SIGTERM, want within the 3s grace (and the unwind)", took)
		}
		if _, err := g.Wait(30 * time.Second); err != nil {
			t.Fatalf("the gateway did not exit after SIGTERM: %v", err)
		}
	})

	t.Run("Chromium and aiohttp open ws:// and wss://, with MITM and without", func(t *testing.T) {
		t.Parallel()
		chromium, err := exec.LookPath(chromiumBinary)
		if err != nil {
			t.Fatalf("%s not found (make test installs it with hack/install-deps.sh): %v", chromiumBinary, err)
		}
		python := pythonWith(t, "aiohttp")
		one := startSquids(t, "ws-clients", "127.0.0.208")
		plain := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.209", Pages: map[string]string{"/": socketPage}})
		secure := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.210", Pages: map[string]string{"/": socketPage}})
		caCert, caKey, _ := makeMITMCA(t, bin)
		siteCA := filepath.Join(t.TempDir(), "site-ca.pem")
		writeFile(t, siteCA, string(secure.CertPEM()))
		httpPort := []string{"--connect-http-ports", strconv.Itoa(plain.Port())}
		gateways := []struct {
			name string
			g    *gatewayProc
			// trust is the CA aiohttp trusts for wss://: the site's own
			// through a plain tunnel, only the gateway's under MITM (so a
			// socket that was not intercepted fails there).
			trust string
		}{
			{"plain", startGateway(t, bin, gwConfig{upstreams: squidURLs(one), args: httpPort}), siteCA},
			{"MITM", startGateway(t, bin, gwConfig{upstreams: squidURLs(one), args: append([]string{
				"--mitm-ca-cert", caCert, "--mitm-ca-key", caKey, "--upstream-ca-file", siteCA}, httpPort...)}), caCert},
		}
		for _, gw := range gateways {
			for _, site := range []*testutil.Target{plain, secure} {
				seen := len(site.Requests())
				var done string
				chromiumUntil(t, chromium, gw.g.addr, site.URL()+"/", func() bool {
					for _, r := range site.Requests()[seen:] {
						if strings.HasPrefix(r.URI, "/done") {
							done = r.URI
							return true
						}
					}
					return false
				})
				if done != "/done?echo=from%20chromium" {
					t.Fatalf("%s gateway, Chromium's socket on %s: the page went to %s, want the echo (the site saw %v)\ngateway log:\n%s",
						gw.name, site.URL(), done, site.Requests()[seen:], tail(gw.g.Output(), 30))
				}
				out, err := exec.Command(python, "-c", aiohttpSocket, "http://"+gw.g.addr, strings.Replace(site.URL(), "http", "ws", 1)+"/aiohttp", gw.trust).CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != "echo:from aiohttp" {
					t.Fatalf("%s gateway, aiohttp's socket on %s: %v\n%s\ngateway log:\n%s", gw.name, site.URL(), err, out, tail(gw.g.Output(), 30))
				}
				// The page, both handshakes and /done, all from the Squid.
				var from []string
				for _, r := range site.Requests()[seen:] {
					from = append(from, r.Source+" "+r.URI)
				}
				if len(from) < 4 || site.Count(one[0].OutgoingAddr()) != len(site.Requests()) {
					t.Fatalf("%s gateway: %s saw %v, want the page, two handshakes and /done, all from the Squid %s", gw.name, site.URL(), from, one[0].OutgoingAddr())
				}
			}
		}
	})
}

// socketPage opens a WebSocket to its own origin (ws:// or wss://), sends
// one message and goes to /done with the echo, which the site sees.
const socketPage = `<!doctype html>
<html><head><title>socket</title></head><body>
<div id="out">waiting</div>
<script>
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/live");
ws.onopen = () => ws.send("from chromium");
ws.onmessage = e => { ws.close(); location = "/done?echo=" + encodeURIComponent(e.data); };
ws.onerror = () => { location = "/done?failed"; };
</script>
</body></html>`

// aiohttpSocket opens a WebSocket with aiohttp through the proxy (argv 1)
// to the URL (argv 2), trusting the CA file (argv 3) for wss://, sends one
// message and prints the echo.
const aiohttpSocket = `
import asyncio, ssl, sys
import aiohttp

async def main(proxy, url, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(url, proxy=proxy, ssl=ctx, timeout=30) as ws:
            await ws.send_str("from aiohttp")
            m = await ws.receive(timeout=30)
            print("echo:" + m.data)

asyncio.run(main(*sys.argv[1:4]))
`

// chromiumUntil opens url in headless Chromium through the gateway and
// keeps it open until done reports true (polled), then stops it. The
// page's certificate (the site's own or the gateway's MITM leaf) is not
// checked. A page with a socket is watched from the site's side, not
// through --dump-dom: Chromium's virtual time does not wait for sockets.
func chromiumUntil(t *testing.T, chromium, gateway, url string, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir="+t.TempDir(),
		"--remote-debugging-port=0",
		"--proxy-server=http://"+gateway,
		"--proxy-bypass-list=<-loopback>",
		"--ignore-certificate-errors",
		url)
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	poll.Until(t, 2*time.Minute, "chromium to be done on "+url, func() error {
		return poll.Check(done(), "not done")
	}, poll.Every(100*time.Millisecond), poll.Report(func() string { return "stderr:\n" + tail(stderr.String(), 30) }))
}
