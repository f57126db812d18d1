//go:build !nomirror

package gateway

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	fhttp2 "github.com/bogdanfinn/fhttp/http2"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// scriptedH2Site is a site on a free port of 127.0.0.1 that speaks HTTP/2
// only (ALPN h2, a certificate of its own) and answers each request's
// HEADERS with answer, which writes the stream's frames itself; asked
// counts the requests it read.
func scriptedH2Site(t *testing.T, answer func(fr *http2.Framer, stream uint32)) (addr string, roots *x509.CertPool, asked *atomic.Int64) {
	t.Helper()
	cert, roots, err := testutil.SelfSignedCert(net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	asked = new(atomic.Int64)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	addr = testutil.ServeTCP(t, func(c net.Conn) {
		tc := tls.Server(c, cfg)
		defer tc.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(tc, preface); err != nil || string(preface) != http2.ClientPreface {
			return
		}
		fr := http2.NewFramer(tc, tc)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		if fr.WriteSettings() != nil {
			return
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() && fr.WriteSettingsAck() != nil {
					return
				}
			case *http2.MetaHeadersFrame:
				asked.Add(1)
				answer(fr, f.StreamID)
			}
		}
	})
	return addr, roots, asked
}

// headersBlock is fields encoded as one HPACK block.
func headersBlock(fields ...string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return b.Bytes()
}

// TestMalformedHTTP2SiteAnswerIsTheSitesFault: on a MITM tunnel's HTTP/2
// site link, what fhttp finds wrong in the site's frames (an answer
// without :status, a frame no HTTP/2 peer may send) is the site's: the
// member relayed encrypted bytes only. The client gets 502
// target_unreachable saying so, no member rests and none other is tried;
// read as the member's, each member it went through rested for every site.
func TestMalformedHTTP2SiteAnswerIsTheSitesFault(t *testing.T) {
	tests := []struct {
		name   string
		answer func(fr *http2.Framer, stream uint32)
	}{
		{name: "an answer without :status", answer: func(fr *http2.Framer, stream uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: headersBlock("content-length", "0"),
				EndStream: true, EndHeaders: true})
		}},
		{name: "a non-numeric :status", answer: func(fr *http2.Framer, stream uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: headersBlock(":status", "ok"),
				EndStream: true, EndHeaders: true})
		}},
		{name: "a DATA frame on a stream never opened", answer: func(fr *http2.Framer, stream uint32) {
			_ = fr.WriteData(stream+2, true, []byte("x"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { h2SitesFault(t, tt.answer, "the site's malformed answer") })
	}
}

// h2SitesFault asks the scripted HTTP/2 site once, through a MITM'd
// tunnel whose client speaks HTTP/2, with two relaying members to go
// through: the client gets 502 target_unreachable whose body has want, no
// member rests for every site and the site is asked once (another member
// would read the same answer).
func h2SitesFault(t *testing.T, answer func(fr *http2.Framer, stream uint32), want string) {
	t.Helper()
	site, roots, asked := scriptedH2Site(t, answer)
	ca, caRoots := newTestCA(t)
	e := newEnv(t, Options{AllowPrivateTargets: true, Retries: 2, SiteRoots: roots,
		MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{},
		relayingUpstream(t, "p1"), relayingUpstream(t, "p2"))
	c := mitmClient(t, e.addr, caRoots, nil, nil)
	c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	a := mitmDo(t, c, http.MethodGet, "https://"+site+"/", nil)
	if a.status != http.StatusBadGateway || a.header.Get(HeaderReason) != ReasonTargetUnreachable || !strings.Contains(a.body, want) {
		t.Fatalf("got %d %s %q; want 502 %s saying %q", a.status, a.header.Get(HeaderReason), a.body, ReasonTargetUnreachable, want)
	}
	if mw := memberWide(e.store); len(mw) != 0 {
		t.Errorf("%v rest for every site; the answer was the site's", mw)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the site was asked %d times, want 1 (another member reads the same answer)", n)
	}
}

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

// endlessContinuation opens the stream's answer head with a HEADERS frame
// and then sends CONTINUATION frames of valid HPACK, 64 MiB of them unless
// the gateway stops reading first; sent counts the bytes written.
func endlessContinuation(sent *atomic.Int64) func(fr *http2.Framer, stream uint32) {
	chunk := headersBlock("x-junk", strings.Repeat("a", 16000))
	return func(fr *http2.Framer, stream uint32) {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: headersBlock(":status", "200")}) != nil {
			return
		}
		for sent.Store(0); sent.Load() < 64<<20; sent.Add(int64(len(chunk))) {
			if fr.WriteContinuation(stream, false, chunk) != nil {
				return
			}
		}
	}
}

// TestHTTP2SiteHeaderBlockIsBounded: a site that sends CONTINUATION frames
// for ever is cut off once its header block passes 1 MiB (fhttp alone
// would read and decode them until the answer timeout): 502
// target_unreachable saying so, no member rests, the site asked once, and
// it could write little more than the bound before its connection ended.
func TestHTTP2SiteHeaderBlockIsBounded(t *testing.T) {
	var sent atomic.Int64
	h2SitesFault(t, endlessContinuation(&sent), "the site's answer head is larger than 1 MiB")
	// What the socket buffers on the way hold comes on top of the bound:
	// the site's send buffer and the member's and gateway's receive and
	// send buffers on its two hops, each as large as the kernel lets
	// loopback autotuning make it (here 32 MiB to receive: a fixed 16 MiB
	// failed a busy make test at 16-23 MiB). A gateway that kept reading
	// takes gigabytes before the answer timeout.
	if n, most := sent.Load(), int64(1<<20)+2*(tcpBufferMax(t, "tcp_rmem")+tcpBufferMax(t, "tcp_wmem")); n > most {
		t.Errorf("the site wrote %d MiB of one header block, more than the bound and every socket buffer on the way (%d MiB); the gateway kept reading", n>>20, most>>20)
	}
}

// tcpBufferMax is the largest TCP buffer the kernel autotunes to, from
// /proc/sys/net/ipv4/<name> (its third figure).
func tcpBufferMax(t *testing.T, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
	if err != nil {
		t.Fatalf("reading the kernel's TCP buffer sizes: %v", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		t.Fatalf("/proc/sys/net/ipv4/%s = %q, want three sizes", name, b)
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		t.Fatalf("/proc/sys/net/ipv4/%s: %v", name, err)
	}
	return n
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
		link, err := goH2Print.open(conn)
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
