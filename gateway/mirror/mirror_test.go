//go:build !nomirror

package mirror

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
)

// captured are ClientHellos real clients sent to an fpsite.Site on
// 127.0.0.1: to its IP address (no server name), or to shop.example
// mapped to it (the "-sni" ones).
func captured(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("testdata/*.hello")
	if err != nil || len(files) < 4 {
		t.Fatalf("captured ClientHellos: %v %v", files, err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".hello")] = b
	}
	return out
}

// asRecord wraps a handshake message in one TLS record.
func asRecord(msg []byte) []byte {
	return append([]byte{22, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// hostFor is the site a captured hello was sent to: shop.example for the
// "-sni" ones, the site's IP address for the others.
func hostFor(name string) string {
	if strings.HasSuffix(name, "-sni") {
		return "shop.example"
	}
	return "127.0.0.1"
}

// resumptions are the ways a site connection can keep sessions without
// one kept to offer: none kept, kept but not offered, offered with
// nothing kept. None may change the hello a site sees.
func resumptions() []Resumption {
	return []Resumption{{}, {Sessions: NewSessions(4), Key: "k"}, {Sessions: NewSessions(4), Key: "k", Offer: true}}
}

func print(t *testing.T, msg []byte) *tlsfp.HelloPrint {
	t.Helper()
	p, err := tlsfp.ParseClientHello(msg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMirroredHelloMatchesTheClients builds the site-facing ClientHello from
// each captured one and reads both with the tests' own parser: JA3 (in the
// order sent), JA4 and every field a site compares are the client's.
func TestMirroredHelloMatchesTheClients(t *testing.T) {
	for name, msg := range captured(t) {
		t.Run(name, func(t *testing.T) {
			_, record, err := ReadHello(bytes.NewReader(asRecord(msg)))
			if err != nil {
				t.Fatal(err)
			}
			h, err := Parse(record)
			if err != nil {
				t.Fatalf("cannot mirror %s: %v", name, err)
			}
			host := hostFor(name)
			// Keeping the site's sessions, or offering one when none is
			// kept, changes nothing a site sees.
			for _, r := range resumptions() {
				built, err := Built(Config{Host: host, Hello: h, Resumption: r})
				if err != nil {
					t.Fatal(err)
				}
				want, got := print(t, msg), print(t, built)
				if want.JA3String() != got.JA3String() || want.JA4() != got.JA4() || want.Shape() != got.Shape() || want.Length != got.Length {
					t.Fatalf("mirrored hello (sessions kept %v, offered %v) differs from %s's:\nJA3  %s\nwant %s\nJA4  %s\nwant %s\n     %s\nwant %s\nlength %d, want %d",
						r.Sessions != nil, r.Offer, name, got.JA3String(), want.JA3String(), got.JA4(), want.JA4(), got.Shape(), want.Shape(), got.Length, want.Length)
				}
				if bytes.Equal(built[6:38], msg[6:38]) {
					t.Fatal("the mirrored hello reuses the client's random")
				}
			}
		})
	}
}

// TestMirroredHelloNamesTheSite: the server name is the site's (the
// CONNECT's host, which was checked), whatever the client sent; ALPN keeps
// only what the gateway speaks.
func TestMirroredHelloNamesTheSite(t *testing.T) {
	msg := captured(t)["chromium-156-sni"]
	h, err := Parse(asRecord(msg))
	if err != nil {
		t.Fatal(err)
	}
	built, err := Built(Config{Host: "other.example", Hello: h, Speaks: func(p string) bool { return p == "http/1.1" }})
	if err != nil {
		t.Fatal(err)
	}
	got := print(t, built)
	if got.ServerName != "other.example" || strings.Join(got.ALPN, ",") != "http/1.1" {
		t.Fatalf("server name %q, ALPN %v; want other.example and http/1.1 only", got.ServerName, got.ALPN)
	}
	if want := print(t, msg); strings.Join(h.ALPN, ",") != strings.Join(want.ALPN, ",") {
		t.Fatalf("Hello.ALPN %v, want the client's %v", h.ALPN, want.ALPN)
	}
}

func TestPresetsBuild(t *testing.T) {
	for _, name := range Presets() {
		p, err := PresetByName(name)
		if err != nil {
			t.Fatal(err)
		}
		built, err := Built(Config{Host: "shop.example", Preset: p})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := print(t, built); got.ServerName != "shop.example" || len(got.CipherSuites) == 0 {
			t.Fatalf("%s: server name %q, %d suites", name, got.ServerName, len(got.CipherSuites))
		}
	}
	if _, err := PresetByName("netscape-4"); err == nil || !strings.Contains(err.Error(), "chrome-133") {
		t.Fatalf("unknown preset: %v, want an error listing the presets", err)
	}
}

// TestUnmirrorableHellos: what Parse refuses, with a reason.
func TestUnmirrorableHellos(t *testing.T) {
	msg := captured(t)["curl-7.88-openssl-3.0"]
	// An extension uTLS cannot send (0x7777, with a body) in place of padding.
	odd := bytes.Clone(msg)
	i := bytes.Index(odd, []byte{0x00, 0x15})
	if i < 0 {
		t.Fatal("no padding extension in curl's hello")
	}
	odd[i], odd[i+1] = 0x77, 0x77
	// A key share for SecP256r1MLKEM768 (which uTLS cannot make) in place
	// of curl's x25519 one.
	pq := bytes.Clone(msg)
	i = bytes.Index(pq, []byte{0x00, 0x33, 0x00, 0x26, 0x00, 0x24, 0x00, 0x1d, 0x00, 0x20})
	if i < 0 {
		t.Fatal("no x25519 key share in curl's hello")
	}
	pq[i+6], pq[i+7] = 0x11, 0xeb
	for name, rec := range map[string][]byte{
		"cut short":         asRecord(msg)[:60],
		"unknown extension": asRecord(odd),
		"unmade key share":  asRecord(pq),
		"not a hello":       {22, 3, 1, 0, 4, 2, 0, 0, 0},
	} {
		if _, err := Parse(rec); err == nil {
			t.Errorf("%s: Parse accepted it", name)
		}
	}
	if _, _, err := ReadHello(strings.NewReader("GET / HTTP/1.1\r\n\r\n")); err == nil || !strings.Contains(err.Error(), "not a TLS handshake") {
		t.Fatalf("plain HTTP: %v", err)
	}
}

// BenchmarkMirror is what mirroring adds per site connection before any
// byte is sent: parsing the client's hello into a fresh spec and building
// the hello from it (Chromium's, the largest), against a preset's.
func BenchmarkMirror(b *testing.B) {
	msg := captured(b)["chromium-156-sni"]
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := Parse(asRecord(msg)); err != nil {
				b.Fatal(err)
			}
		}
	})
	h, err := Parse(asRecord(msg))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("spec", func(b *testing.B) {
		for b.Loop() {
			if _, err := h.Spec("shop.example", nil, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("build mirrored", func(b *testing.B) {
		for b.Loop() {
			if _, err := Built(Config{Host: "shop.example", Hello: h}); err != nil {
				b.Fatal(err)
			}
		}
	})
	p, _ := PresetByName(DefaultPreset)
	b.Run("build preset", func(b *testing.B) {
		for b.Loop() {
			if _, err := Built(Config{Host: "shop.example", Preset: p}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// withPSK is msg (a ClientHello handshake message) with a pre_shared_key
// extension (one identity, one binder) appended last, as a client resuming
// a session sends it.
func withPSK(msg []byte) []byte {
	ext := []byte{0, 41, 0, 47, 0, 10, 0, 4, 't', 'k', 't', '1', 0, 0, 0, 1, 0, 33, 32}
	return withExt(msg, append(ext, make([]byte, 32)...))
}

// withExt is msg with the extension ext (type, length, data) appended.
func withExt(msg, ext []byte) []byte {
	out := append([]byte(nil), msg...)
	out = append(out, ext...)
	n := len(out) - 4
	out[1], out[2], out[3] = byte(n>>16), byte(n>>8), byte(n)
	// The extensions' length is the two bytes before the first extension.
	b := out[4+2+32:]
	sid := int(b[0])
	b = b[1+sid:]
	cs := int(b[0])<<8 | int(b[1])
	b = b[2+cs:]
	cm := int(b[0])
	b = b[1+cm:]
	el := (int(b[0])<<8 | int(b[1])) + len(ext)
	b[0], b[1] = byte(el>>8), byte(el)
	return out
}

// TestAResumingHelloOffersOnlyAKeptSession: a client's hello that resumes
// (its pre-shared key last) is built without a pre-shared key unless a
// kept site session is offered, and otherwise like the client's; the
// gateway's own PSK never carries the client's identity.
func TestAResumingHelloOffersOnlyAKeptSession(t *testing.T) {
	for name, msg := range captured(t) {
		t.Run(name, func(t *testing.T) {
			resuming := withPSK(msg)
			h, err := Parse(asRecord(resuming))
			if err != nil {
				t.Fatalf("a resuming hello cannot be mirrored: %v", err)
			}
			want := print(t, msg)
			host := hostFor(name)
			for _, r := range resumptions() {
				built, err := Built(Config{Host: host, Hello: h, Resumption: r})
				if err != nil {
					t.Fatal(err)
				}
				got := print(t, built)
				if slices.Contains(got.Extensions, 41) || bytes.Contains(built, []byte("tkt1")) {
					t.Fatalf("offer %v with nothing kept: the built hello carries a pre-shared key: %v", r.Offer, got.Extensions)
				}
				if got.JA4() != want.JA4() || got.Shape() != want.Shape() {
					t.Fatalf("offer %v: built %s %s, want the client's first-visit hello %s %s", r.Offer, got.JA4(), got.Shape(), want.JA4(), want.Shape())
				}
			}
		})
	}
}
