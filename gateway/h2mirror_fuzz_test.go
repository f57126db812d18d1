//go:build !nomirror

package gateway

import (
	"bytes"
	"fmt"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
// SETTINGS keep the client's order without duplicates, with a usable
// connection window and the four pseudo-headers.
func FuzzH2Print(f *testing.F) {
	f.Add(h2Start(f))
	f.Add([]byte(http2.ClientPreface))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := readH2Print(bytes.NewReader(in))
		if err != nil {
			return
		}
		tr := p.transport()
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
		if len(seen) != len(tr.Settings) {
			t.Fatalf("order %v, settings %v", tr.SettingsOrder, tr.Settings)
		}
		if tr.ConnectionFlow < minMirroredConnFlow || len(tr.PseudoHeaderOrder) != 4 {
			t.Fatalf("connection window %d, pseudo-headers %v", tr.ConnectionFlow, tr.PseudoHeaderOrder)
		}
	})
}

func TestH2PrintReadsChromiumsStart(t *testing.T) {
	p, err := readH2Print(bytes.NewReader(h2Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	tr := p.transport()
	if len(tr.SettingsOrder) != 4 || tr.SettingsOrder[0] != 1 || tr.SettingsOrder[3] != 6 || tr.Settings[4] != 6291456 ||
		tr.ConnectionFlow != 15663105 || tr.PseudoHeaderOrder[1] != ":authority" || !tr.HeaderPriority.Exclusive || tr.HeaderPriority.Weight != 255 {
		t.Fatalf("read %+v as %+v", p, tr)
	}
	// ALPS for h2: the SETTINGS payload, id then value, in order.
	if a := fmt.Sprintf("%x", p.alps()); a != "000100010000"+"000200000000"+"000400600000"+"000600040000" {
		t.Fatalf("ALPS data %s", a)
	}
}
