//go:build !nomirror

package sitelink

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	fhttp "github.com/bogdanfinn/fhttp"
	fhttp2 "github.com/bogdanfinn/fhttp/http2"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/proxyfleet/proxyfleet/gateway/link"
)

// HTTP/2 on both sides of a mirroring tunnel: a client that offers h2 gets
// HTTP/2 from the gateway (net/http's server, every stream a request on
// the plain-HTTP path), which speaks at once, and the gateway reads the
// client's first frames as the server reads them (Tap): its SETTINGS
// (values and order), connection WINDOW_UPDATE, PRIORITY frames, and the
// first HEADERS' priority and pseudo-header order. A site that picks h2
// then gets those, through bogdanfinn/fhttp's HTTP/2 client, which writes
// them as told.

// H2Print is what a client's first HTTP/2 frames said.
type H2Print struct {
	settings       []fhttp2.Setting
	connFlow       uint32 // connection WINDOW_UPDATE increment (0: none)
	priorities     []fhttp2.Priority
	headerPriority fhttp2.PriorityParam
	pseudo         []string
}

// minMirroredConnFlow is the smallest connection window increment mirrored:
// fhttp's client counts its own receive window from 15663105 and tops it up
// at half of that, so a client that announced less than about 8 MiB would
// leave the site waiting for a WINDOW_UPDATE that never comes. Such a
// client's increment is sent as 15663105 (Chromium's) instead.
const minMirroredConnFlow = 8 << 20

// minMirroredStreamWindow is the smallest SETTINGS_INITIAL_WINDOW_SIZE
// mirrored: fhttp's client gives a stream window back only as its body is
// read, so a site told a window of 0 (or a few bytes) would send the
// gateway nothing more of an answer and the request would stall; a client
// that says less (h2spec does; no browser or HTTP library here does) is
// sent as 65535, the protocol's default. Towards the client the gateway's
// own server keeps to the client's window, whatever the site's is.
const minMirroredStreamWindow = 65535

// maxMirroredTable bounds the HPACK table the gateway offers a site: a
// client's larger SETTINGS_HEADER_TABLE_SIZE would let the site make the
// gateway hold that much per connection.
const maxMirroredTable = 1 << 20

// ReadH2Print reads the client preface and the frames up to the first
// complete HEADERS from r.
func ReadH2Print(r io.Reader) (*H2Print, error) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		return nil, errors.New("no HTTP/2 client preface")
	}
	fr := http2.NewFramer(io.Discard, r)
	fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil)
	fr.MaxHeaderListSize = ClientHeadMax
	p := &H2Print{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			_ = f.ForeachSetting(func(s http2.Setting) error {
				p.settings = append(p.settings, fhttp2.Setting{ID: fhttp2.SettingID(s.ID), Val: s.Val})
				return nil
			})
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				p.connFlow = f.Increment
			}
		case *http2.PriorityFrame:
			p.priorities = append(p.priorities, fhttp2.Priority{StreamID: f.StreamID,
				PriorityParam: fhttp2.PriorityParam{StreamDep: f.StreamDep, Exclusive: f.Exclusive, Weight: f.Weight}})
		case *http2.MetaHeadersFrame:
			if f.HasPriority() {
				p.headerPriority = fhttp2.PriorityParam{StreamDep: f.Priority.StreamDep, Exclusive: f.Priority.Exclusive, Weight: f.Priority.Weight}
			}
			for _, hf := range f.Fields {
				if strings.HasPrefix(hf.Name, ":") {
					p.pseudo = append(p.pseudo, hf.Name)
				}
			}
			return p, nil
		}
	}
}

// ALPS is the ALPS data for h2 a client with these SETTINGS sends: the
// SETTINGS payload, as Chromium does.
func (p *H2Print) ALPS() []byte {
	b := make([]byte, 0, 6*len(p.settings))
	for _, s := range p.settings {
		b = append(b, byte(s.ID>>8), byte(s.ID), byte(s.Val>>24), byte(s.Val>>16), byte(s.Val>>8), byte(s.Val))
	}
	return b
}

// H2Conn is a site link's HTTP/2 connection: fhttp's client over conn.
type H2Conn struct {
	cc   *fhttp2.ClientConn
	conn net.Conn
}

// Open starts HTTP/2 over tc, the site's TLS connection, as the client
// did, its header blocks bounded by headerBlockGuard.
func (p *H2Print) Open(tc net.Conn) (*H2Conn, error) {
	cc, err := p.Transport().NewClientConn(&headerBlockGuard{Conn: tc})
	if err != nil {
		return nil, err
	}
	return &H2Conn{cc: cc, conn: tc}, nil
}

// close ends the link by closing its connection, not with fhttp's
// ClientConn.Close, for the reason headerBlockGuard.Write gives: the read
// loop fails its next read and ends every stream itself.
func (h *H2Conn) close()        { _ = h.conn.Close() }
func (h *H2Conn) canTake() bool { return h.cc.CanTakeNewRequest() }

// roundTrip sends out and answers in net/http's types. A failure fhttp
// found in the site's frames is the site's (h2SiteFault).
func (h *H2Conn) roundTrip(out *http.Request) (*http.Response, error) {
	resp, err := H2RoundTrip(h.cc, out)
	if err != nil && out.Context().Err() == nil {
		err = h2SiteFault(err)
	}
	return resp, err
}

// headerBlockGuard bounds what a site may send as one header block
// (a HEADERS or PUSH_PROMISE frame and its CONTINUATIONs) to
// link.MaxResponseHead bytes, as every other path bounds an answer head. fhttp
// itself reads CONTINUATION frames for as long as they come, decoding
// them after its header list size is passed (x/net's fix for that,
// CVE-2023-45288, is not in it): a site could keep a gateway's core busy
// until the answer timeout. The guard follows the frame headers in the
// bytes fhttp reads, nothing else, and fails the read with link.ErrHeadTooLarge
// once a block passes the bound; fhttp ends the connection with it.
type headerBlockGuard struct {
	net.Conn
	hdr   [9]byte // the frame header being read
	hn    int     // bytes of it read
	skip  int     // payload bytes of the current frame still to come
	block int     // header block bytes so far
	err   error   // link.ErrHeadTooLarge once a block passed the bound
}

func (g *headerBlockGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	for b := p[:n]; len(b) > 0; {
		if g.skip > 0 {
			k := min(g.skip, len(b))
			g.skip -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.hn:], b)
		g.hn += k
		b = b[k:]
		if g.hn < len(g.hdr) {
			break
		}
		g.hn = 0
		g.skip = int(g.hdr[0])<<16 | int(g.hdr[1])<<8 | int(g.hdr[2])
		switch http2.FrameType(g.hdr[3]) {
		case http2.FrameHeaders, http2.FramePushPromise, http2.FrameContinuation:
			if g.block += g.skip; g.block > link.MaxResponseHead {
				g.err = link.ErrHeadTooLarge
				return n, g.err
			}
			if http2.Flags(g.hdr[4]).Has(http2.FlagHeadersEndHeaders) {
				g.block = 0
			}
		}
	}
	return n, err
}

// Write passes fhttp's writes on; a write that fails closes the
// connection and is reported to fhttp as done. fhttp v0.6.2 keeps a
// connection's first write error, and a RoundTrip that meets one closes
// the connection from the caller's goroutine (ClientConn.Close), which
// closes every stream's body pipe while the read loop may be assigning the
// pipe of another stream whose answer is arriving (handleResponse writes
// cs.bufPipe outside the connection's lock): a data race, and a lock
// overwritten while held. -race found it in TestMITMH2ConformsAsTheSiteDoes
// after a link was dropped (close) while requests still came for it. With
// the connection closed instead, the read loop fails its next read and
// ends every stream itself, in its own goroutine, and the round trip fails
// as a lost connection, as it would have a moment later.
func (g *headerBlockGuard) Write(p []byte) (int, error) {
	if _, err := g.Conn.Write(p); err != nil {
		_ = g.Conn.Close()
	}
	return len(p), nil
}

// fhttp's words for answer heads it refuses, which have no error values
// of their own outside the package.
const (
	h2HeadTooLarge   = "http2: response header list larger than advertised limit"
	h2Malformed      = "malformed response from server"
	h2TooManyInterim = "http2: too many 1xx informational responses"
)

// h2SiteFault gives a failed HTTP/2 round trip on a site link its verdict.
// Past the site's TLS the member relays encrypted bytes only, so what
// fhttp itself found wrong in the frames is the site's, firsthand: a
// protocol violation that ends the connection (ConnectionError) or a
// stream (a StreamError fhttp raised with its reason: a reset the site
// sent carries none), an answer head without a valid :status, more 1xx
// heads than it takes, or one past the header list size the connection
// advertised (the client's own SETTINGS_MAX_HEADER_LIST_SIZE, mirrored;
// 10 MiB when it sent none). Anything else (the connection closed or
// reset, a reset or GOAWAY from the site) is returned as it is.
func h2SiteFault(err error) error {
	var (
		ce fhttp2.ConnectionError
		se fhttp2.StreamError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, link.ErrHeadTooLarge):
		return HeadFault(err, true)
	case strings.Contains(msg, h2HeadTooLarge):
		return HeadFault(&MalformedHead{Err: errors.New("its head is larger than the HTTP/2 connection's header list size")}, true)
	case errors.As(err, &ce), errors.As(err, &se) && se.Cause != nil,
		strings.HasPrefix(msg, h2Malformed), msg == h2TooManyInterim:
		return HeadFault(&MalformedHead{Err: err}, true)
	}
	return err
}

// isNoCachedConn is fhttp's answer on an HTTP/2 connection that can take
// no more requests: the link is stale.
func isNoCachedConn(err error) bool { return errors.Is(err, fhttp2.ErrNoCachedConn) }

// Transport is an fhttp HTTP/2 client that opens connections the way the
// client did.
func (p *H2Print) Transport() *fhttp2.Transport {
	t := &fhttp2.Transport{DisableCompression: true, ReadIdleTimeout: link.IdleConnTimeout,
		Settings: map[fhttp2.SettingID]uint32{}, ConnectionFlow: p.connFlow,
		Priorities: p.priorities, PseudoHeaderOrder: p.pseudo}
	if t.ConnectionFlow < minMirroredConnFlow {
		t.ConnectionFlow = 15663105
	}
	hp := p.headerPriority
	t.HeaderPriority = &hp
	for _, s := range p.settings {
		switch {
		case s.ID == fhttp2.SettingEnablePush:
			s.Val = 0 // the gateway takes no pushes, whatever the client would
		case s.ID == fhttp2.SettingHeaderTableSize && s.Val > maxMirroredTable:
			s.Val = maxMirroredTable
		case s.ID == fhttp2.SettingInitialWindowSize && s.Val < minMirroredStreamWindow:
			s.Val = minMirroredStreamWindow
		case s.ID == fhttp2.SettingInitialWindowSize && s.Val > 1<<31-1,
			s.ID == fhttp2.SettingMaxFrameSize && (s.Val < 1<<14 || s.Val > 1<<24-1):
			continue // invalid: the site would end the connection
		}
		if _, dup := t.Settings[s.ID]; !dup {
			t.SettingsOrder = append(t.SettingsOrder, s.ID)
		}
		t.Settings[s.ID] = s.Val
		if s.ID == fhttp2.SettingHeaderTableSize {
			t.HeaderTableSize = s.Val
		}
		if s.ID == fhttp2.SettingInitialWindowSize {
			t.InitialWindowSize = s.Val
		}
	}
	if len(t.PseudoHeaderOrder) != 4 {
		t.PseudoHeaderOrder = []string{":method", ":authority", ":scheme", ":path"}
	}
	return t
}

// maxH2Start bounds what Tap keeps of a client's first bytes while it
// waits for the first complete HEADERS: a client preface, its SETTINGS,
// WINDOW_UPDATE and PRIORITY frames and a header block of up to
// ClientHeadMax fit many times over. Past it the client's frames
// are not mirrored (its site connections open as Go's would).
const maxH2Start = 4 * ClientHeadMax

// Tap is a mirroring tunnel's client connection as its HTTP/2 server
// reads it: the server speaks at once (its SETTINGS go out as soon as the
// client's preface is in, as RFC 9113 3.4 has it, for a client that waits
// for them before sending more), and the tap reads the client's first
// frames as they pass, up to the first complete HEADERS, into the
// tunnel's H2Print. It reads them on the server's own read, before the
// server sees them, so the print is whole before any request the client
// sent can open a site connection.
type Tap struct {
	net.Conn
	// Print is where the tunnel keeps the print its site links open with.
	Print *atomic.Pointer[H2Print]
	seen  []byte
	done  bool
}

// errNoH2Preface ends a connection that chose h2 and does not start with
// the HTTP/2 client preface: RFC 9113 3.4 has the server close it (the
// inner server, which also speaks HTTP/1.1, would answer it as a request).
var errNoH2Preface = errors.New("the client chose h2 but sent no HTTP/2 connection preface")

func (c *Tap) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		if i := len(c.seen); i < len(http2.ClientPreface) {
			k := min(n, len(http2.ClientPreface)-i)
			if string(p[:k]) != http2.ClientPreface[i:i+k] {
				c.done, c.seen = true, nil
				_ = c.Conn.Close()
				return 0, errNoH2Preface
			}
		}
		c.seen = append(c.seen, p[:n]...)
		switch pr, whole := ReadH2Start(c.seen); {
		case whole:
			c.done, c.seen = true, nil
			if pr != nil {
				c.Print.Store(pr)
			}
		case len(c.seen) > maxH2Start:
			c.done, c.seen = true, nil
		}
	}
	return n, err
}

// ReadH2Start reads the client's start from b, the bytes it sent so far:
// whole is false while it may still come (b ends inside it); the print is
// nil when b is whole but no start the gateway can mirror.
func ReadH2Start(b []byte) (*H2Print, bool) {
	r := &eofReader{r: bytes.NewReader(b)}
	p, err := ReadH2Print(r)
	if err != nil && r.eof {
		return nil, false
	}
	return p, true
}

// eofReader notes reaching the end of r.
type eofReader struct {
	r   io.Reader
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.eof = true
	}
	return n, err
}

// GoH2Print opens a site's HTTP/2 connection for a client that spoke
// HTTP/1.1 to the gateway (there are no frames of its own to mirror) as
// Go's x/net/http2 client does.
var GoH2Print = &H2Print{
	settings: []fhttp2.Setting{{ID: fhttp2.SettingEnablePush, Val: 0}, {ID: fhttp2.SettingInitialWindowSize, Val: 4 << 20},
		{ID: fhttp2.SettingMaxFrameSize, Val: 16 << 10}, {ID: fhttp2.SettingMaxHeaderListSize, Val: link.MaxResponseHead}},
	connFlow: 1 << 30,
	pseudo:   []string{":authority", ":method", ":path", ":scheme"},
}

// H2RoundTrip sends out over an fhttp HTTP/2 connection and answers in
// net/http's types.
func H2RoundTrip(cc *fhttp2.ClientConn, out *http.Request) (*http.Response, error) {
	h := make(fhttp.Header, len(out.Header)+1)
	for k, vv := range out.Header {
		h[k] = vv
	}
	fr := &fhttp.Request{Method: out.Method, URL: out.URL, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header: h, Body: out.Body, GetBody: out.GetBody, ContentLength: out.ContentLength,
		Host: out.Host, Trailer: fhttp.Header(out.Trailer)}
	fr = fr.WithContext(out.Context())
	resp, err := cc.RoundTrip(fr)
	if err != nil {
		return nil, err
	}
	return &http.Response{Status: resp.Status, StatusCode: resp.StatusCode, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor,
		ProtoMinor: resp.ProtoMinor, Header: http.Header(resp.Header), Body: resp.Body, ContentLength: resp.ContentLength,
		Trailer: http.Header(resp.Trailer), Uncompressed: resp.Uncompressed, Request: out}, nil
}
