//go:build !nomirror

package mirror

import (
	"bytes"
	"slices"
	"testing"

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
