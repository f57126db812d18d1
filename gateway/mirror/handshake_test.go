//go:build !nomirror

package mirror

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
)

// handshakeSite is a TLS site of the test's own on 127.0.0.1 (Go's
// crypto/tls, as the sites behind a Go front are) whose server picks the
// key-exchange group from groups, in its own order, and records the raw
// ClientHello of each connection before crypto/tls reads it.
type handshakeSite struct {
	addr   string
	roots  *x509.CertPool
	hellos chan []byte
	states chan tls.ConnectionState
}

func startHandshakeSite(t testing.TB, cfg *tls.Config) *handshakeSite {
	t.Helper()
	cert, _, err := testutil.SelfSignedCert(net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Clone()
	cfg.Certificates = []tls.Certificate{cert}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}))
	s := &handshakeSite{addr: ln.Addr().String(), roots: roots, hellos: make(chan []byte, 16), states: make(chan tls.ConnectionState, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				read, msg, err := tlsfp.ReadClientHello(c)
				if err != nil {
					return
				}
				s.hellos <- msg
				tc := tls.Server(&replay{Conn: c, r: io.MultiReader(bytes.NewReader(read), c)}, cfg)
				if err := tc.Handshake(); err != nil {
					return
				}
				s.states <- tc.ConnectionState()
				_, _ = io.Copy(io.Discard, tc)
			}()
		}
	}()
	return s
}

type replay struct {
	net.Conn
	r io.Reader
}

func (c *replay) Read(p []byte) (int, error) { return c.r.Read(p) }

// siteGroups are the key-exchange groups a site may take. Go's server
// picks among them in an order of its own (X25519MLKEM768, then x25519,
// then the NIST curves), so each set leaves out what it prefers to pick
// another: the key share a client sent first, another it sent, one it
// only listed (a HelloRetryRequest over TLS 1.3).
var siteGroups = map[string][]tls.CurveID{
	"X25519MLKEM768":  {tls.X25519MLKEM768, tls.X25519, tls.CurveP256},
	"x25519":          {tls.X25519, tls.CurveP256, tls.CurveP384},
	"P-256":           {tls.CurveP256, tls.CurveP384},
	"P-384":           {tls.CurveP384},
	"TLS 1.2, x25519": {tls.X25519, tls.CurveP256},
	"TLS 1.2, P-256":  {tls.CurveP256, tls.CurveP384},
	"TLS 1.2, P-384":  {tls.CurveP384},
}

// TestMirroredHandshakesComplete is the differential test over the
// corpus: every recorded ClientHello (testdata/*.hello, and the presets'
// hellos) is mirrored against a TLS site of the
// test's own, whichever of the client's groups the site prefers (the key
// share the client sent first, another it sent, one it only listed, which
// takes a HelloRetryRequest) and over TLS 1.3 and 1.2. The handshake must
// complete, and the hello the site read must have the client's JA3, JA4
// and every field a site compares. (GnuTLS sends key shares for P-256 and
// then x25519; a site preferring x25519 failed the mirrored handshake with
// "tls: invalid server key share".)
func TestMirroredHandshakesComplete(t *testing.T) {
	corpus := captured(t)
	for _, name := range Presets() {
		p, _ := PresetByName(name)
		built, err := Built(Config{Host: "127.0.0.1", Preset: p})
		if err != nil {
			t.Fatal(err)
		}
		corpus["preset-"+name] = built
	}
	for name, msg := range corpus {
		if hostFor(name) != "127.0.0.1" {
			continue // the site's certificate is for its IP address
		}
		want := print(t, msg)
		for groups, prefs := range siteGroups {
			cfg := &tls.Config{CurvePreferences: prefs, NextProtos: []string{"h2", "http/1.1"}}
			if bytes.HasPrefix([]byte(groups), []byte("TLS 1.2")) {
				cfg.MaxVersion = tls.VersionTLS12
			}
			offered := false
			for _, g := range prefs {
				offered = offered || slices.Contains(want.Groups, uint16(g))
			}
			if !offered {
				continue // no group in common: the client itself fails here
			}
			t.Run(name+"/"+groups, func(t *testing.T) {
				site := startHandshakeSite(t, cfg)
				h, err := Parse(asRecord(msg))
				if err != nil {
					t.Fatalf("cannot mirror: %v", err)
				}
				c, err := net.Dial("tcp", site.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				u, err := Client(ctx, c, Config{Host: "127.0.0.1", Roots: site.roots, Hello: h})
				if err != nil {
					t.Fatalf("the mirrored handshake failed: %v", err)
				}
				defer u.Close()
				got := print(t, <-site.hellos)
				if got.JA3String() != want.JA3String() || got.JA4() != want.JA4() || got.Shape() != want.Shape() || got.Length != want.Length {
					t.Fatalf("the site read\nJA4 %s %s\nwant the client's\nJA4 %s %s", got.JA4(), got.Shape(), want.JA4(), want.Shape())
				}
				st := <-site.states
				if !slices.Contains(prefs, st.CurveID) {
					t.Fatalf("the site negotiated group %v, not one it takes", st.CurveID)
				}
			})
		}
	}
}

// TestOnlyTheGatewaysOwnFailuresAreOwnErrors: a mirrored handshake that
// fails because the gateway's TLS library cannot do what the hello it
// built offered is an *OwnError saying what; one that fails because of
// what the site did (an alert, a certificate that does not verify, a
// closed connection) is not, so the gateway judges it as the site's.
func TestOnlyTheGatewaysOwnFailuresAreOwnErrors(t *testing.T) {
	hellos := captured(t)
	for _, tc := range []struct {
		name, hello string
		cfg         *tls.Config
		roots       func(*handshakeSite) *x509.CertPool
		hangUp      bool
		own         string // the OwnError's reason; "" none
	}{
		// Go 1.26 lists SecP256r1MLKEM768 without a share for it; a site
		// insisting on it asks in a HelloRetryRequest.
		{name: "a group uTLS cannot do, asked for", hello: "go-1.26", cfg: &tls.Config{CurvePreferences: []tls.CurveID{tls.SecP256r1MLKEM768}}, own: "group"},
		{name: "the site's alert: no group in common", hello: "chromium-156", cfg: &tls.Config{CurvePreferences: []tls.CurveID{tls.CurveP521}}},
		{name: "a certificate that does not verify", hello: "curl-7.88-openssl-3.0", cfg: &tls.Config{},
			roots: func(*handshakeSite) *x509.CertPool { return x509.NewCertPool() }},
		{name: "the site hangs up", hello: "wget-1.21-gnutls-3.7", cfg: &tls.Config{}, hangUp: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var site *handshakeSite
			if tc.hangUp {
				site = startHangUpSite(t)
			} else {
				site = startHandshakeSite(t, tc.cfg)
			}
			roots := site.roots
			if tc.roots != nil {
				roots = tc.roots(site)
			}
			h, err := Parse(asRecord(hellos[tc.hello]))
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp", site.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = Client(ctx, c, Config{Host: "127.0.0.1", Roots: roots, Hello: h})
			if err == nil {
				t.Fatal("the handshake completed")
			}
			var oe *OwnError
			switch {
			case tc.own == "" && errors.As(err, &oe):
				t.Fatalf("the site's doing (%v) was taken for the gateway's own failure (%s)", err, oe.Reason)
			case tc.own != "" && !errors.As(err, &oe):
				t.Fatalf("%v: want the gateway's own failure", err)
			case tc.own != "" && oe.Reason != tc.own:
				t.Fatalf("%v: reason %s, want %s", err, oe.Reason, tc.own)
			}
		})
	}
}

// startHangUpSite is a site that reads the ClientHello and closes the
// connection without a word.
func startHangUpSite(t *testing.T) *handshakeSite {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _, _ = tlsfp.ReadClientHello(c)
			c.Close()
		}
	}()
	return &handshakeSite{addr: ln.Addr().String(), roots: x509.NewCertPool()}
}

// TestClosestPreset: a client whose hello cannot be completed falls back
// to the preset closest to it: Chromium to Chrome's, the others (no
// GREASE, many suites) not to Chrome's; the configured preset leads among
// equals and when there is no hello to compare.
func TestClosestPreset(t *testing.T) {
	hellos := captured(t)
	def := Preset{DefaultPreset}
	for name, want := range map[string]func(string) bool{
		"chromium-156": func(p string) bool { return p == "chrome-133" },
		"wget-1.21-gnutls-3.7": func(p string) bool {
			return p != "chrome-133" && p != "chrome-131"
		},
		"curl-7.88-openssl-3.0": func(p string) bool { return p != "chrome-133" && p != "chrome-131" },
	} {
		h, err := Parse(asRecord(hellos[name]))
		if err != nil {
			t.Fatal(err)
		}
		order := Closest(h, def)
		if len(order) != len(Presets()) || !want(order[0].Name) {
			t.Fatalf("%s falls back to %v", name, order)
		}
	}
	if order := Closest(nil, Preset{"safari-16"}); order[0].Name != "safari-16" || len(order) != len(Presets()) {
		t.Fatalf("without a hello: %v, want the given preset first, then the others", order)
	}
}
