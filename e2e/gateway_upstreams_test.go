package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestGatewayUpstreamSchemesAndCredentials covers what the other scenarios
// leave out of "CONNECT is chained through the chosen upstream
// (... upstream credentials sent ...)" and of the https:// member kind: a
// member URL's user:password reaches the upstream as Proxy-Authorization, on
// CONNECT and on plain HTTP, over http:// and over https:// (TLS to the
// upstream, verified against the system roots the gateway's environment
// names). The upstream is a real Squid behind a small recording front that
// reads the first request head of each connection and passes every byte on.
func TestGatewayUpstreamSchemesAndCredentials(t *testing.T) {
	bin := testutil.BuildBinary(t)
	sq := startSquids(t, "schemes", "127.0.0.101")[0]
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.104"})
	tlsTarget := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.105"})

	dir := t.TempDir()
	caFile := filepath.Join(dir, "front-ca.pem")
	tlsFront := startRecordingFront(t, "127.0.0.102", sq.Addr(), caFile)
	plainFront := startRecordingFront(t, "127.0.0.103", sq.Addr(), "")
	trustFront := []string{"SSL_CERT_FILE=" + caFile}

	for _, tc := range []struct {
		name  string
		front *recordingFront
		url   string
	}{
		{"http:// member with credentials", plainFront, "http://alice:pl%40in-s3cret@" + plainFront.addr},
		{"https:// member with credentials", tlsFront, "https://bob:tls-s3cret@" + tlsFront.addr},
	} {
		t.Run(tc.name+" sends them on CONNECT and plain HTTP", func(t *testing.T) {
			g := startGateway(t, bin, gwConfig{upstreams: []string{tc.url}, env: trustFront})
			u := splitUserinfo(t, tc.url)
			want := basicAuth(u[0], u[1])

			tc.front.reset()
			mustGetOK(t, g.tunnelClient(t, "", tlsTarget.ClientTLSConfig()), tlsTarget.URL()+"/via-connect", nil)
			if got := tc.front.heads(); len(got) != 1 || got[0].method != http.MethodConnect || got[0].auth != want {
				t.Fatalf("the upstream saw %+v, want one CONNECT with Proxy-Authorization %q", got, want)
			}
			if src := tlsTarget.Sources(); len(src) != 1 || src[0] != sq.OutgoingAddr() {
				t.Fatalf("the HTTPS target saw %v, want Squid's %s", src, sq.OutgoingAddr())
			}

			tc.front.reset()
			r := mustGetOK(t, g.client(t, "", nil), target.URL()+"/via-forward", nil)
			if r.source != sq.OutgoingAddr() {
				t.Fatalf("the target saw %s, want Squid's %s", r.source, sq.OutgoingAddr())
			}
			if got := tc.front.heads(); len(got) != 1 || got[0].method != http.MethodGet || got[0].auth != want {
				t.Fatalf("the upstream saw %+v, want one GET with Proxy-Authorization %q", got, want)
			}
		})
	}

	t.Run("an https:// member whose certificate is not trusted is never used", func(t *testing.T) {
		// No SSL_CERT_FILE: the front's self-signed certificate does not verify.
		g := startGateway(t, bin, gwConfig{upstreams: []string{"https://" + tlsFront.addr}})
		tlsFront.reset()
		r := mustGet(t, g.client(t, "", nil), target.URL()+"/untrusted", nil)
		if r.status < 500 || r.source != "" {
			t.Fatalf("GET through an untrusted https:// member: %d from %q, want a 5xx from the gateway", r.status, r.source)
		}
		if _, resp, err := testutil.ConnectTunnel(g.addr, tlsTarget.Addr(), nil, 10*time.Second); err == nil && resp.StatusCode == http.StatusOK {
			t.Fatal("CONNECT through an untrusted https:// member was answered 200")
		}
		if got := tlsFront.heads(); len(got) != 0 {
			t.Fatalf("requests %+v reached the upstream although its certificate does not verify", got)
		}
	})
}

// splitUserinfo returns the user and password of a proxy URL.
func splitUserinfo(t *testing.T, raw string) [2]string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		t.Fatalf("member URL %s: want user:password (%v)", raw, err)
	}
	pass, _ := u.User.Password()
	return [2]string{u.User.Username(), pass}
}

// seenHead is the first request head a recordingFront read on a connection.
type seenHead struct {
	method string
	auth   string // Proxy-Authorization
}

// recordingFront listens on a loopback address (with TLS when caFile is
// set, its certificate written there as PEM), records the first request
// head of every connection, and relays every byte to backend unchanged.
type recordingFront struct {
	addr    string
	backend string
	mu      sync.Mutex
	seen    []seenHead
}

func startRecordingFront(t *testing.T, host, backend, caFile string) *recordingFront {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	if caFile != "" {
		cert, certPEM := frontCertificate(t, net.ParseIP(host))
		writeFile(t, caFile, string(certPEM))
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	f := &recordingFront{addr: ln.Addr().String(), backend: backend}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); f.relay(c) }()
		}
	}()
	return f
}

func (f *recordingFront) relay(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	tp := textproto.NewReader(br)
	first, err := tp.ReadLine()
	if err != nil {
		return // e.g. a TLS handshake the client gave up on
	}
	head := first + "\r\n"
	h := seenHead{method: strings.SplitN(first, " ", 2)[0]}
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		head += line + "\r\n"
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Proxy-Authorization") {
			h.auth = strings.TrimSpace(v)
		}
	}
	f.mu.Lock()
	f.seen = append(f.seen, h)
	f.mu.Unlock()

	up, err := net.DialTimeout("tcp", f.backend, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	_ = up.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(up, head); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, up)
		_ = c.Close()
		close(done)
	}()
	_, _ = io.Copy(up, br)
	_ = up.Close()
	<-done
}

func (f *recordingFront) reset() {
	f.mu.Lock()
	f.seen = nil
	f.mu.Unlock()
}

func (f *recordingFront) heads() []seenHead {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenHead(nil), f.seen...)
}

// frontCertificate is a self-signed certificate for ip and its PEM.
func frontCertificate(t *testing.T, ip net.IP) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "e2e upstream front " + ip.String()},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{ip},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
