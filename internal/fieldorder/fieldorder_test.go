package fieldorder

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

func names(o Order) []string {
	var out []string
	for n := range o.Names {
		out = append(out, n)
	}
	return out
}

func TestParseKeepsNamesAsWritten(t *testing.T) {
	tests := []struct {
		name  string
		head  string
		want  []string
		conn  string
		count int
	}{
		{"names in order, case kept", "GET / HTTP/1.1\r\nHost: a\r\nsec-ch-ua: x\r\nUser-Agent: u\r\naccept: */*\r\n\r\n",
			[]string{"Host", "sec-ch-ua", "User-Agent", "accept"}, "", 4},
		{"a name written twice is there twice", "GET / HTTP/1.1\r\nCookie: a\r\nX: 1\r\ncookie: b\r\n\r\n",
			[]string{"Cookie", "X", "cookie"}, "", 3},
		{"bare LF ends lines too", "GET / HTTP/1.1\nHost: a\nAccept: b\n\n", []string{"Host", "Accept"}, "", 2},
		{"a folded line names nothing", "GET / HTTP/1.1\r\nX-Long: a\r\n  b:c\r\n\tmore\r\nY: 1\r\n\r\n", []string{"X-Long", "Y"}, "", 2},
		{"nothing after the empty line", "POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nBody: no\r\n", []string{"Content-Length"}, "", 1},
		{"a cut head keeps what it has", "GET / HTTP/1.1\r\nA: 1\r\nB: 2", []string{"A", "B"}, "", 2},
		{"Connection's persistence options, as written", "GET / HTTP/1.1\r\nConnection: Keep-Alive, Upgrade\r\nconnection: x-a ,close\r\n\r\n",
			[]string{"Connection", "connection"}, "Keep-Alive, close", 2},
		{"no fields", "GET / HTTP/1.0\r\n\r\n", nil, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Parse([]byte(tc.head))
			if got := names(o); !slices.Equal(got, tc.want) {
				t.Fatalf("names %q, want %q", got, tc.want)
			}
			if o.Connection() != tc.conn {
				t.Fatalf("Connection %q, want %q", o.Connection(), tc.conn)
			}
			if o.Len() != tc.count {
				t.Fatalf("Len %d, want %d", o.Len(), tc.count)
			}
		})
	}
}

func TestContextCarriesTheOrder(t *testing.T) {
	if _, ok := FromContext(context.Background()); ok {
		t.Fatal("an empty context carries an order")
	}
	o := Parse([]byte("GET / HTTP/1.1\r\nB: 1\r\nA: 2\r\n\r\n"))
	got, ok := FromContext(NewContext(context.Background(), o))
	if !ok || got != o {
		t.Fatalf("got %+v %v, want %+v", got, ok, o)
	}
}

// readHeads reads requests off raw through a Recorder under a small
// bufio.Reader, as the front end does, and returns each one's order.
func readHeads(t testing.TB, raw string, bufSize int) []Order {
	var rec Recorder
	rec.R = strings.NewReader(raw)
	br := bufio.NewReaderSize(&rec, bufSize)
	var out []Order
	for {
		if _, err := br.Peek(1); err != nil {
			return out
		}
		buffered, _ := br.Peek(br.Buffered())
		rec.Start(buffered)
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Logf("after %d heads: %v", len(out), err)
			rec.Abort()
			return out
		}
		out = append(out, rec.Stop(br.Buffered()))
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return out
		}
	}
}

// TestRecorderSeesEachPipelinedHead: requests that arrive in one read
// (pipelined, with bodies) and heads larger than the reader's buffer
// are each recorded whole and alone.
func TestRecorderSeesEachPipelinedHead(t *testing.T) {
	long := strings.Repeat("v", 5000)
	raw := "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 15\r\nzed: 1\r\n\r\nBody-Name: no\r\n" +
		"GET /b HTTP/1.1\r\nhost: h\r\nX-Long: " + long + "\r\nAccept: */*\r\n\r\n" +
		"GET /c HTTP/1.1\r\nB: 1\r\nA: 1\r\n\r\n"
	want := [][]string{{"Host", "Content-Length", "zed"}, {"host", "X-Long", "Accept"}, {"B", "A"}}
	for _, size := range []int{16, 4096, 64 << 10} {
		got := readHeads(t, raw, size)
		if len(got) != len(want) {
			t.Fatalf("buffer %d: %d heads, want %d", size, len(got), len(want))
		}
		for i := range want {
			if n := names(got[i]); !slices.Equal(n, want[i]) {
				t.Fatalf("buffer %d, request %d: %q, want %q", size, i, n, want[i])
			}
		}
	}
}

// TestRecorderKeepsNothingBetweenHeads: outside a recording nothing is
// copied and no buffer is held.
func TestRecorderKeepsNothingBetweenHeads(t *testing.T) {
	var rec Recorder
	rec.R = strings.NewReader("GET / HTTP/1.1\r\nA: 1\r\n\r\n")
	rec.Start(nil)
	if _, err := rec.Read(make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	rec.Stop(0)
	if rec.buf != nil {
		t.Fatal("a stopped recording holds its buffer")
	}
	if _, err := rec.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if rec.buf != nil {
		t.Fatal("a read outside a recording took a buffer")
	}
}

// FuzzParse: for any head net/http's parser accepts, read through a
// Recorder as the front end reads it, the names Parse finds are the
// fields the parser kept, one name per value, in the parser's order of
// values, and none holds a colon or a line end.
func FuzzParse(f *testing.F) {
	f.Add("GET / HTTP/1.1\r\nHost: a\r\nsec-ch-ua: x\r\nCookie: 1\r\ncookie: 2\r\n\r\n")
	f.Add("POST http://h/x HTTP/1.1\nContent-Length: 1\nConnection: close, keep-alive\n\nx")
	f.Add("GET / HTTP/1.1\r\nX-Long: a\r\n  b:c\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	f.Fuzz(func(t *testing.T, raw string) {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		got := readHeads(t, raw, 16)
		if len(got) == 0 {
			t.Fatalf("the parser read a head the recording did not: %q", raw)
		}
		o := got[0]
		if whole := Parse([]byte(raw)); whole.names != o.names || whole.conn != o.conn {
			t.Fatalf("recorded %q, the whole input parses as %q", o.names, whole.names)
		}
		seen := map[string][]string{}
		for n := range o.Names {
			if strings.ContainsAny(n, ":\r\n") || n == "" {
				t.Fatalf("name %q", n)
			}
			k := textproto.CanonicalMIMEHeaderKey(n)
			seen[k] = append(seen[k], n)
		}
		for k, vv := range req.Header {
			if len(seen[k]) != len(vv) {
				t.Fatalf("the parser kept %d values of %q, the order has %d lines: %q", len(vv), k, len(seen[k]), o.names)
			}
		}
		for k := range seen {
			switch k {
			case "Host", "Transfer-Encoding", "Content-Length":
				continue // the parser moves or drops these
			}
			if _, ok := req.Header[k]; !ok {
				t.Fatalf("the order names %q, which the parser did not keep", k)
			}
		}
		if c := o.Connection(); c != "" && !bytes.Contains(bytes.ToLower([]byte(strings.Join(req.Header["Connection"], ","))), bytes.ToLower([]byte(strings.SplitN(c, ",", 2)[0]))) {
			t.Fatalf("Connection options %q are not in %q", c, req.Header["Connection"])
		}
	})
}
