package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
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
