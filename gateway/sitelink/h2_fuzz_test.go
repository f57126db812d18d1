//go:build !nomirror

package sitelink

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/proxyfleet/proxyfleet/gateway/link"
)

// h2Start writes a client's HTTP/2 start as Chromium's: preface, SETTINGS,
// WINDOW_UPDATE, HEADERS with a priority.
func h2Start(t testing.TB) []byte {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	_ = fr.WriteSettings(http2.Setting{ID: 1, Val: 65536}, http2.Setting{ID: 2, Val: 0}, http2.Setting{ID: 4, Val: 6291456}, http2.Setting{ID: 6, Val: 262144})
	_ = fr.WriteWindowUpdate(0, 15663105)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":authority", "a.example"}, {":scheme", "https"}, {":path", "/"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true,
		Priority: http2.PriorityParam{Exclusive: true, Weight: 255}})
	return b.Bytes()
}

// FuzzH2Print feeds a client's first HTTP/2 bytes (outside input) to
// readH2Print: it never panics, and what it reads makes a transport whose
// SETTINGS keep the client's order without duplicates, with usable
// connection and stream windows and the four pseudo-headers.
func FuzzH2Print(f *testing.F) {
	f.Add(h2Start(f))
	f.Add([]byte(http2.ClientPreface))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	// h2spec's: an initial window of 0 after Chromium's SETTINGS, before
	// the first request.
	start := h2Start(f)
	settingsEnd := len(http2.ClientPreface) + 9 + 4*6
	zero := append(bytes.Clone(start[:settingsEnd]), 0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0)
	f.Add(append(zero, start[settingsEnd:]...))
	f.Fuzz(func(t *testing.T, in []byte) {
		sp, whole := ReadH2Start(in)
		p, err := ReadH2Print(bytes.NewReader(in))
		if err == nil && (!whole || sp == nil) {
			t.Fatalf("a start readH2Print reads was not read by the tap (whole %v)", whole)
		}
		if err != nil {
			return
		}
		tr := p.Transport()
		seen := map[uint16]bool{}
		for _, id := range tr.SettingsOrder {
			if seen[uint16(id)] {
				t.Fatalf("setting %d twice in %v", id, tr.SettingsOrder)
			}
			seen[uint16(id)] = true
		}
		if tr.Settings[2] != 0 || tr.Settings[1] > maxMirroredTable || tr.Settings[4] > 1<<31-1 {
			t.Fatalf("settings %v: push on, a table too large or a window the site refuses", tr.Settings)
		}
		if w, ok := tr.Settings[4]; ok && (w < minMirroredStreamWindow || tr.InitialWindowSize != w) {
			t.Fatalf("settings %v, initial window %d: a stream window under %d would stall the site's answers", tr.Settings, tr.InitialWindowSize, minMirroredStreamWindow)
		}
		if len(seen) != len(tr.Settings) {
			t.Fatalf("order %v, settings %v", tr.SettingsOrder, tr.Settings)
		}
		if tr.ConnectionFlow < minMirroredConnFlow || len(tr.PseudoHeaderOrder) != 4 {
			t.Fatalf("connection window %d, pseudo-headers %v", tr.ConnectionFlow, tr.PseudoHeaderOrder)
		}
	})
}

func TestH2PrintReadsChromiumsStart(t *testing.T) {
	p, err := ReadH2Print(bytes.NewReader(h2Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Transport()
	if len(tr.SettingsOrder) != 4 || tr.SettingsOrder[0] != 1 || tr.SettingsOrder[3] != 6 || tr.Settings[4] != 6291456 ||
		tr.ConnectionFlow != 15663105 || tr.PseudoHeaderOrder[1] != ":authority" || !tr.HeaderPriority.Exclusive || tr.HeaderPriority.Weight != 255 {
		t.Fatalf("read %+v as %+v", p, tr)
	}
	// ALPS for h2: the SETTINGS payload, id then value, in order.
	if a := fmt.Sprintf("%x", p.ALPS()); a != "000100010000"+"000200000000"+"000400600000"+"000600040000" {
		t.Fatalf("ALPS data %s", a)
	}
}

// FuzzHeaderBlockGuard feeds headerBlockGuard a site's bytes in reads of
// any size: it never panics, and it fails (with link.ErrHeadTooLarge) exactly
// when a reference walk of the whole stream finds a header block past the
// bound, on the read that brought the frame header passing it.
func FuzzHeaderBlockGuard(f *testing.F) {
	f.Add(frameBytes(http2.FrameHeaders, http2.FlagHeadersEndHeaders, 3), uint16(1))
	f.Add([]byte{0xff, 0xff, 0xff, byte(http2.FrameContinuation), 0, 0, 0, 0, 1}, uint16(4))
	f.Add(append(frameBytes(http2.FrameData, 0, 9), 0x10, 0, 0, byte(http2.FrameHeaders)), uint16(7))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint16) {
		n := int(chunk%64) + 1
		fail := -1 // the offset just past the frame header that passes the bound
		for off, block := 0, 0; off+9 <= len(in); {
			h := in[off : off+9]
			size := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
			switch http2.FrameType(h[3]) {
			case http2.FrameHeaders, http2.FramePushPromise, http2.FrameContinuation:
				block += size
				if http2.Flags(h[4]).Has(http2.FlagHeadersEndHeaders) && block <= link.MaxResponseHead {
					block = 0
				}
			}
			if block > link.MaxResponseHead {
				fail = off + 9
				break
			}
			off += 9 + size
		}
		g := &headerBlockGuard{Conn: readerConn{r: &chunked{b: in, n: n}}}
		got, err := io.Copy(io.Discard, g)
		switch {
		case fail < 0 && err != nil:
			t.Fatalf("%v after %d bytes; no block passes the bound", err, got)
		case fail < 0 && got != int64(len(in)):
			t.Fatalf("%d of %d bytes through", got, len(in))
		case fail >= 0 && !errors.Is(err, link.ErrHeadTooLarge):
			t.Fatalf("%v after %d bytes; the frame header ending at %d passes the bound", err, got, fail)
		case fail >= 0 && (got < int64(fail) || got >= int64(fail+n)):
			t.Fatalf("failed after %d bytes in reads of %d; the frame header passing the bound ends at %d", got, n, fail)
		}
	})
}
