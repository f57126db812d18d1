//go:build !nomirror

package gateway

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestMITMH2ServerSpeaksFirst: an HTTP/2 client that sends its connection
// preface and then waits for the server's (its SETTINGS) before sending
// anything more, as RFC 9113 3.4 allows and h2spec does, is answered with
// the gateway's SETTINGS at once and then served: its GET reaches the site
// over HTTP/2 with the client's SETTINGS and pseudo-header order mirrored.
// Before, the gateway withheld its preface until it had read the client's
// first request, and such a client waited for ever.
func TestMITMH2ServerSpeaksFirst(t *testing.T) {
	e := newFPEnv(t, "127.0.0.230", FingerprintMirror)
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	connect := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: e.site.Addr()}, Host: e.site.Addr(), Header: http.Header{}}
	if err := connect.Write(c); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, connect); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(&bufConn{Conn: c, r: br}, &tls.Config{ServerName: "127.0.0.230", RootCAs: e.caRoots, NextProtos: []string{"h2"}})
	_ = tc.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.Handshake(); err != nil || tc.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("handshake: %v, ALPN %q", err, tc.ConnectionState().NegotiatedProtocol)
	}
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, http2.Setting{ID: http2.SettingEnablePush, Val: 0}); err != nil {
		t.Fatal(err)
	}
	// Nothing more until the server's preface.
	_ = tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("no server preface within 20s after the client's (the gateway waits for a request first?): %v", err)
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		t.Fatalf("the server's first frame is %v, want its SETTINGS", f)
	}
	if err := fr.WriteSettingsAck(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, hf := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", e.site.Addr()}, {":path", "/waited"}, {"user-agent", "h2-waiter"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	_ = tc.SetReadDeadline(time.Now().Add(30 * time.Second))
	status, attempts := "", ""
	for ended := false; !ended; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 && status == "" {
				status, attempts = f.PseudoValue("status"), headerValue(f, "x-proxyfleet-attempts")
			}
			ended = f.StreamID == 1 && f.StreamEnded()
		case *http2.DataFrame:
			ended = f.StreamID == 1 && f.StreamEnded()
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.RSTStreamFrame:
			t.Fatalf("RST_STREAM %v", f.ErrCode)
		}
	}
	if status != "200" || attempts != "1" {
		t.Fatalf("answer %s after %s attempts, want a 200 after 1", status, attempts)
	}
	conns := e.site.Conns()
	if len(conns) != 1 || conns[0].ALPN != "h2" || len(conns[0].Seen()) != 1 || conns[0].Seen()[0].Path != "/waited" {
		t.Fatalf("the site saw %d connections; want one HTTP/2 connection carrying /waited", len(conns))
	}
	if want := "4:1048576;2:0|15663105|0|m,s,a,p"; conns[0].H2 != want {
		t.Fatalf("the site saw the HTTP/2 start %q, want the client's mirrored %q", conns[0].H2, want)
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// bufConn reads from r (which may hold bytes read past a CONNECT answer).
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
