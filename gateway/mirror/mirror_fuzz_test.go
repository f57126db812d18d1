package mirror

import (
	"bytes"
	"slices"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
)

// FuzzParseHello feeds a crawler's first bytes (outside input) to
// ReadHello and Parse: they never panic, and a hello Parse accepts is
// built into one that offers the same cipher suites and ALPN list.
func FuzzParseHello(f *testing.F) {
	for _, msg := range captured(f) {
		f.Add(asRecord(msg))
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
		built, err := Built(Config{Host: "127.0.0.1", Hello: h})
		if err != nil {
			return // uTLS refused the spec: the gateway falls back to a preset
		}
		want, err1 := tlsfp.ParseClientHello(record[5:])
		got, err2 := tlsfp.ParseClientHello(built)
		if err2 != nil {
			t.Fatalf("the built hello does not parse: %v", err2)
		}
		if err1 == nil && (!slices.Equal(want.CipherSuites, got.CipherSuites) || !slices.Equal(want.ALPN, got.ALPN)) {
			t.Fatalf("built suites %x ALPN %q, want the client's %x %q", got.CipherSuites, got.ALPN, want.CipherSuites, want.ALPN)
		}
	})
}
