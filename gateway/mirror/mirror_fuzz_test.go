//go:build !nomirror

package mirror

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
)

// FuzzParseHello feeds a crawler's first bytes (outside input) to
// ReadHello and Parse: they never panic, and a hello Parse accepts is
// built into one that offers the same cipher suites and ALPN list, also
// when a kept site session is offered in place of the client's
// pre-shared key (nothing kept: the hello is built without one).
func FuzzParseHello(f *testing.F) {
	for _, msg := range captured(f) {
		f.Add(asRecord(msg))
		// Resuming: the pre-shared key last, and (invalid) not last.
		f.Add(asRecord(withPSK(msg)))
		f.Add(asRecord(withExt(withPSK(msg), []byte{0x0a, 0x0a, 0, 0})))
	}
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		_, record, err := ReadHello(bytes.NewReader(in))
		if err != nil {
			return
		}
		h, err := Parse(record)
		if err != nil {
			return
		}
		for _, r := range []Resumption{{}, {Sessions: NewSessions(1), Key: "k", Offer: true}} {
			built, err := Built(Config{Host: "127.0.0.1", Hello: h, Resumption: r})
			if err != nil {
				continue // uTLS refused the spec: the gateway falls back to a preset
			}
			want, err1 := tlsfp.ParseClientHello(record[5:])
			got, err2 := tlsfp.ParseClientHello(built)
			if err2 != nil {
				t.Fatalf("the built hello (offer %v) does not parse: %v", r.Offer, err2)
			}
			if err1 == nil && (!slices.Equal(want.CipherSuites, got.CipherSuites) || !slices.Equal(want.ALPN, got.ALPN)) {
				t.Fatalf("built (offer %v) suites %x ALPN %q, want the client's %x %q", r.Offer, got.CipherSuites, got.ALPN, want.CipherSuites, want.ALPN)
			}
		}
	})
}

// FuzzServerShare feeds a site's first bytes (outside input) to the
// reading of its ServerHello's key share: it never panics, and a
// ServerHello whose key share names a group is read as that group
// however its records split it.
func FuzzServerShare(f *testing.F) {
	f.Add(serverHelloRecords(0x001d, 0), uint8(0))
	f.Add(serverHelloRecords(0x0017, 3), uint8(7))
	f.Add([]byte{21, 3, 3, 0, 2, 2, 40}, uint8(0))
	f.Fuzz(func(t *testing.T, in []byte, split uint8) {
		_, _ = serverShare(in)
		_ = keyShareOf(in)
		g := binary.BigEndian.Uint16(append(bytes.Clone(in), 0, 0))
		if g == 0 {
			return
		}
		rec := serverHelloRecords(g, int(split))
		got, whole := serverShare(rec)
		if !whole || uint16(got) != g {
			t.Fatalf("a ServerHello choosing %#04x split at %d: read %#04x (whole %v)", g, split, got, whole)
		}
		if _, whole := serverShare(rec[:len(rec)-1]); whole {
			t.Fatal("a ServerHello cut short was read as whole")
		}
	})
}

// serverHelloRecords is a TLS 1.3 ServerHello choosing group (with a
// 32-byte share), in two handshake records split at split bytes of the
// message (one record when split is 0 or past its end).
func serverHelloRecords(group uint16, split int) []byte {
	body := []byte{3, 3}
	body = append(body, bytes.Repeat([]byte{7}, 32)...)
	body = append(body, 0, 0x13, 0x01, 0)
	ext := []byte{0, 43, 0, 2, 3, 4, 0, 51, 0, 36, byte(group >> 8), byte(group), 0, 32}
	ext = append(ext, make([]byte, 32)...)
	body = append(body, byte(len(ext)>>8), byte(len(ext)))
	body = append(body, ext...)
	msg := append([]byte{2, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	rec := func(b []byte) []byte { return append([]byte{22, 3, 3, byte(len(b) >> 8), byte(len(b))}, b...) }
	if split <= 0 || split >= len(msg) {
		return rec(msg)
	}
	return append(rec(msg[:split]), rec(msg[split:])...)
}

// FuzzMirroredHandshake mirrors mutated ClientHellos (outside input: a
// crawler's first bytes) against a TLS site of the test's own that takes
// anything Go's TLS does (TLS 1.2 and 1.3, every group and suite it
// has). Whatever the hello, the handshake the gateway builds from it
// completes, or fails as the gateway's own (*OwnError: it falls back to a
// preset, blaming no one), or fails on the site's word (its alert, for a
// hello no server would take, which a client sending it directly gets
// too). Nothing else: a failure of the gateway's making that looked like
// the site's or the member's (a closed connection, a timeout, an error
// uTLS raised without an alert) would rest a member for a site that did
// nothing wrong. It never panics.
func FuzzMirroredHandshake(f *testing.F) {
	for _, msg := range captured(f) {
		f.Add(asRecord(msg))
	}
	for _, name := range Presets() {
		p, _ := PresetByName(name)
		if built, err := Built(Config{Host: "127.0.0.1", Preset: p}); err == nil {
			f.Add(asRecord(built))
		}
	}
	site := startHandshakeSite(f, &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		CurvePreferences: []tls.CurveID{tls.X25519MLKEM768, tls.SecP256r1MLKEM768, tls.SecP384r1MLKEM1024, tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521}})
	go func() {
		for range site.hellos {
		}
	}()
	go func() {
		for range site.states {
		}
	}()
	f.Fuzz(func(t *testing.T, in []byte) {
		_, record, err := ReadHello(bytes.NewReader(in))
		if err != nil {
			return
		}
		h, err := Parse(record)
		if err != nil {
			return // not mirrored: the fallback preset from the start
		}
		c, err := net.Dial("tcp", site.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		u, err := Client(ctx, c, Config{Host: "127.0.0.1", Roots: site.roots, Hello: h, Speaks: func(p string) bool { return p == "h2" || p == "http/1.1" }})
		if err == nil {
			u.Close()
			return
		}
		var (
			oe *OwnError
			ne *net.OpError
		)
		if errors.As(err, &oe) || (errors.As(err, &ne) && ne.Op == "remote error") {
			return
		}
		t.Fatalf("the mirrored handshake failed as neither the gateway's own failure nor the site's word: %T %v", err, err)
	})
}
