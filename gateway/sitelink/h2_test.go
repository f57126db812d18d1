//go:build !nomirror

package sitelink

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	fhttp2 "github.com/bogdanfinn/fhttp/http2"
	"golang.org/x/net/http2"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestHTTP2SiteFaultReadsOnlyWhatFHTTPFoundWrong pins h2SiteFault's
// reading of fhttp's errors: its own findings are the site's, a closed or
// reset connection and a reset the site sent stay as they are.
func TestHTTP2SiteFaultReadsOnlyWhatFHTTPFoundWrong(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		sites bool
	}{
		{"a protocol violation that ended the connection", fhttp2.ConnectionError(fhttp2.ErrCodeProtocol), true},
		{"a stream fhttp reset with its reason", fhttp2.StreamError{StreamID: 1, Code: fhttp2.ErrCodeProtocol, Cause: errors.New("invalid header field value")}, true},
		{"no :status", errors.New("malformed response from server: missing status pseudo header"), true},
		{"too many 1xx heads", errors.New("http2: too many 1xx informational responses"), true},
		{"a head past the header list size", errors.New("http2: response header list larger than advertised limit"), true},
		{"a reset the site sent", fhttp2.StreamError{StreamID: 1, Code: fhttp2.ErrCodeRefusedStream}, false},
		{"the connection closed", io.ErrUnexpectedEOF, false},
		{"the connection reset", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
		{"a GOAWAY", fhttp2.GoAwayError{LastStreamID: 1, ErrCode: fhttp2.ErrCodeNo}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h2SiteFault(tt.err)
			ae, ok := got.(*fault.Attempt)
			if sites := ok && ae.Firsthand && ae.F.Fault == rotation.FaultSite; sites != tt.sites {
				t.Fatalf("h2SiteFault(%v) = %#v; the site's, firsthand: %v, want %v", tt.err, got, sites, tt.sites)
			}
			if !tt.sites && got != tt.err {
				t.Fatalf("h2SiteFault(%v) = %v; want it as it is", tt.err, got)
			}
		})
	}
}

// frameBytes is one HTTP/2 frame of type typ with flags and a payload of n bytes.
func frameBytes(typ http2.FrameType, flags http2.Flags, n int) []byte {
	b := []byte{byte(n >> 16), byte(n >> 8), byte(n), byte(typ), byte(flags), 0, 0, 0, 1}
	return append(b, make([]byte, n)...)
}

// readerConn is a net.Conn whose reads come from r.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestHeaderBlockGuardCountsHeaderFramesOnly: the guard adds up HEADERS,
// PUSH_PROMISE and CONTINUATION payloads until END_HEADERS, whatever
// the reads' sizes; other frames, however long, count for nothing, and a
// block that ends starts the next count at zero.
func TestHeaderBlockGuardCountsHeaderFramesOnly(t *testing.T) {
	const max = link.MaxResponseHead
	var within, over bytes.Buffer
	for _, b := range [][]byte{
		frameBytes(http2.FrameSettings, 0, 18),
		frameBytes(http2.FrameHeaders, 0, max/2),
		frameBytes(http2.FrameContinuation, http2.FlagContinuationEndHeaders, max/2),
		frameBytes(http2.FrameData, 0, 1<<24-1),
		frameBytes(http2.FramePushPromise, http2.FlagPushPromiseEndHeaders, max),
		frameBytes(http2.FrameHeaders, http2.FlagHeadersEndHeaders, max),
	} {
		within.Write(b)
	}
	over.Write(within.Bytes())
	over.Write(frameBytes(http2.FrameHeaders, 0, max-10))
	over.Write(frameBytes(http2.FrameContinuation, 0, 11))
	over.Write(frameBytes(http2.FrameContinuation, http2.FlagContinuationEndHeaders, 1))
	for _, chunk := range []int{1, 7, 9, 4096, 1 << 20} {
		g := &headerBlockGuard{Conn: readerConn{r: &chunked{b: within.Bytes(), n: chunk}}}
		if n, err := io.Copy(io.Discard, g); err != nil || n != int64(within.Len()) {
			t.Fatalf("reads of %d: %d of %d bytes, %v; want every block within the bound through", chunk, n, within.Len(), err)
		}
		g = &headerBlockGuard{Conn: readerConn{r: &chunked{b: over.Bytes(), n: chunk}}}
		n, err := io.Copy(io.Discard, g)
		if !errors.Is(err, link.ErrHeadTooLarge) {
			t.Fatalf("reads of %d: %v after %d bytes; want link.ErrHeadTooLarge", chunk, err, n)
		}
		if stop := int64(within.Len() + 2*9 + max); n > stop+int64(chunk) {
			t.Fatalf("reads of %d: %d bytes passed, want at most %d (the frame header that passed the bound)", chunk, n, stop+int64(chunk))
		}
		if _, err := g.Read(make([]byte, 1)); !errors.Is(err, link.ErrHeadTooLarge) {
			t.Fatalf("a read after the bound: %v; want link.ErrHeadTooLarge again", err)
		}
	}
}

// chunked reads b n bytes at a time.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.b))
	copy(p, c.b[:k])
	c.b = c.b[k:]
	return k, nil
}

// TestASiteLinkWhoseWritesFailEndsItsRoundTripsFromTheReadLoop: a write
// the site's connection refuses closes the connection and is not handed to
// fhttp as its write error, on which its RoundTrip would close the
// connection from the caller's goroutine while the read loop may be
// handing another stream its answer (a data race in fhttp v0.6.2, see
// headerBlockGuard.Write). The round trip still fails, as a lost
// connection, and nothing waits for ever.
func TestASiteLinkWhoseWritesFailEndsItsRoundTripsFromTheReadLoop(t *testing.T) {
	client, site := net.Pipe()
	g := &headerBlockGuard{Conn: client}
	_ = site.Close()
	if n, err := g.Write([]byte("PRI")); n != 3 || err != nil {
		t.Fatalf("a write to a closed site: %d, %v; want 3, nil (the connection closed instead)", n, err)
	}
	if _, err := g.Read(make([]byte, 1)); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a read after a failed write: %v; want the connection closed by the guard", err)
	}

	// The site takes the client's preface and SETTINGS, sends its own, and
	// goes away without reading the request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		site, err := ln.Accept()
		if err != nil {
			return
		}
		defer site.Close()
		if _, err := io.ReadFull(site, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(site, site)
		if _, err := fr.ReadFrame(); err != nil {
			return
		}
		_ = fr.WriteSettings()
	}()
	done := make(chan error, 1)
	go func() {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			done <- err
			return
		}
		link, err := GoH2Print.Open(conn)
		if err != nil {
			done <- err
			return
		}
		defer link.close()
		for range 3 {
			req, _ := http.NewRequest(http.MethodGet, "https://site.test/", nil)
			resp, err := link.roundTrip(req)
			if resp != nil {
				_ = resp.Body.Close()
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a round trip over a connection the site closed succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a round trip over a connection the site closed did not end within 30 s")
	}
}

// TestH2StartIsReadWhateverItsPieces: the tap reads a client's HTTP/2
// start the same however the connection cuts it: not whole before its
// last byte, then the print readH2Print reads from it in one piece.
func TestH2StartIsReadWhateverItsPieces(t *testing.T) {
	start := h2Start(t)
	want, err := ReadH2Print(bytes.NewReader(start))
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(start) {
		if p, whole := ReadH2Start(start[:i]); whole || p != nil {
			t.Fatalf("the first %d of %d bytes read as a whole start", i, len(start))
		}
	}
	got, whole := ReadH2Start(append(bytes.Clone(start), "more"...))
	if !whole || got == nil || got.Transport().ConnectionFlow != want.Transport().ConnectionFlow ||
		len(got.settings) != len(want.settings) || len(got.pseudo) != 4 {
		t.Fatalf("the whole start read as %+v (whole %v), want %+v", got, whole, want)
	}
	if p, whole := ReadH2Start([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")); !whole || p != nil {
		t.Fatalf("bytes that are no HTTP/2 start: %v %v, want whole and nothing to mirror", p, whole)
	}
}
