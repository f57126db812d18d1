package httphead

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
)

// hopByHop are the fields a proxy does not send on (the gateway's
// forwardHeader drops them, and what Connection names).
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// sendOn reads raw as the front end reads a client's head and makes the
// request the gateway sends on: hop-by-hop fields dropped, its context
// carrying the client's field order.
func sendOn(t testing.TB, raw string) *http.Request {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range req.Header["Connection"] {
		for _, tok := range strings.Split(c, ",") {
			delete(req.Header, http.CanonicalHeaderKey(strings.TrimSpace(tok)))
		}
	}
	for _, k := range hopByHop {
		delete(req.Header, k)
	}
	if req.URL.Host == "" {
		req.URL.Scheme, req.URL.Host = "http", req.Host
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // as the gateway's forwardHeader
	}
	// The gateway keeps its own links open whatever the client asked.
	req.RequestURI, req.Close = "", false
	return req.WithContext(fieldorder.NewContext(context.Background(), fieldorder.Parse([]byte(raw))))
}

func write(t testing.TB, req *http.Request, proxy bool) string {
	t.Helper()
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	if err := WriteRequest(w, req, proxy); err != nil {
		t.Fatal(err)
	}
	_ = w.Flush()
	return b.String()
}

const chromiumHead = "GET /p?q=1 HTTP/1.1\r\n" +
	"Host: site.example\r\n" +
	"Connection: keep-alive\r\n" +
	"sec-ch-ua: \"Chromium\";v=\"140\"\r\n" +
	"sec-ch-ua-mobile: ?0\r\n" +
	"Upgrade-Insecure-Requests: 1\r\n" +
	"User-Agent: Mozilla/5.0 HeadlessChrome/140\r\n" +
	"Accept: text/html\r\n" +
	"Sec-Fetch-Site: none\r\n" +
	"Accept-Encoding: gzip, deflate, br, zstd\r\n" +
	"Accept-Language: en-US\r\n\r\n"

func TestWriteOrderedKeepsTheClientsOrderAndNames(t *testing.T) {
	tests := []struct {
		name   string
		raw    string
		proxy  bool
		change func(r *http.Request)
		want   string
	}{
		{"a browser's head goes on as it came", chromiumHead, false, nil, chromiumHead},
		{"in absolute form to a proxy, the same fields", strings.Replace(chromiumHead, "GET /p", "GET http://site.example/p", 1), true, nil,
			strings.Replace(chromiumHead, "GET /p", "GET http://site.example/p", 1)},
		{"hop-by-hop and proxy fields are left out where they were",
			"GET http://h.example/ HTTP/1.1\r\nHost: h.example\r\nProxy-Authorization: Basic eDp5\r\nUser-Agent: curl/8\r\nAccept: */*\r\nProxy-Connection: Keep-Alive\r\nX-Drop: 1\r\nConnection: X-Drop\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h.example\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n"},
		{"a name written twice keeps its values in their lines",
			"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\nX: y\r\ncookie: b=2\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\nX: y\r\ncookie: b=2\r\n\r\n"},
		{"Host where the client put it, with the absolute URI's host",
			"GET http://uri.example/ HTTP/1.1\r\nAccept: */*\r\nhost: other.example\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nAccept: */*\r\nhost: uri.example\r\n\r\n"},
		{"no Host line: Host first", "GET http://h.example/ HTTP/1.0\r\nAccept: */*\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h.example\r\nAccept: */*\r\n\r\n"},
		{"close goes to the site", "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nAccept: */*\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nAccept: */*\r\n\r\n"},
		{"close does not go to a proxy", "GET http://h/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\nAccept: */*\r\n\r\n", true, nil,
			"GET http://h/ HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n"},
		{"only the persistence options of Connection", "GET / HTTP/1.1\r\nHost: h\r\nconnection: Keep-Alive, TE\r\nTE: trailers\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h\r\nconnection: Keep-Alive\r\n\r\n"},
		{"the request's own Connection at the client's line",
			"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n", false,
			func(r *http.Request) {
				r.Header["Connection"], r.Header["Upgrade"] = []string{"Upgrade"}, []string{"websocket"}
			},
			"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n"},
		{"fields the client did not write go after its own, sorted", "GET http://h/ HTTP/1.1\r\nHost: h\r\nZ: 1\r\n\r\n", true,
			func(r *http.Request) {
				r.Header["Proxy-Authorization"] = []string{"Basic bTpw"}
				r.Header["Z"] = append(r.Header["Z"], "2")
				r.Header["A"] = []string{"x"}
			},
			"GET http://h/ HTTP/1.1\r\nHost: h\r\nZ: 1\r\nA: x\r\nProxy-Authorization: Basic bTpw\r\nZ: 2\r\n\r\n"},
		{"a User-Agent the client did not send is none", "GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, nil, "GET / HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"an empty User-Agent the client sent is sent", "GET / HTTP/1.1\r\nHost: h\r\nUser-Agent:\r\n\r\n", false, nil,
			"GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: \r\n\r\n"},
		{"a head without fields gets Host alone", "POST http://h.example/ HTTP/1.0\r\n\r\n", false, nil, "POST / HTTP/1.1\r\nHost: h.example\r\n\r\n"},
		{"a bodiless POST without a length gets none", "POST / HTTP/1.1\r\nHost: h\r\n\r\n", false, nil, "POST / HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"a bodiless POST with a length keeps it", "POST / HTTP/1.1\r\ncontent-length: 0\r\nHost: h\r\n\r\n", false, nil,
			"POST / HTTP/1.1\r\ncontent-length: 0\r\nHost: h\r\n\r\n"},
		{"a body with its length", "POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\nContent-Type: text/plain\r\n\r\nabc", false, nil,
			"POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\nContent-Type: text/plain\r\n\r\nabc"},
		{"a chunked body read whole goes with its length at the chunked line",
			"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nX: 1\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false,
			func(r *http.Request) {
				r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(strings.NewReader("abc")), 3, nil
			},
			"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nX: 1\r\n\r\nabc"},
		{"a chunked body streams chunked",
			"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding: chunked\r\nX: 1\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false, nil,
			"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding: chunked\r\nX: 1\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := sendOn(t, tc.raw)
			if tc.change != nil {
				tc.change(req)
			}
			if got := write(t, req, tc.proxy); got != tc.want {
				t.Fatalf("wrote\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// TestWriteOrderedDeclines: what writeOrdered leaves to the other
// writers is written in Go's order, as before.
func TestWriteOrderedDeclines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		raw    string
		change func(r *http.Request)
	}{
		{"a Close request", "GET / HTTP/1.1\r\nHost: h\r\nB: 1\r\nA: 1\r\n\r\n", func(r *http.Request) { r.Close = true }},
		{"a body of unknown length", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nB: 1\r\nA: 1\r\n\r\nx", func(r *http.Request) { r.ContentLength = 0 }},
		{"a body the client did not frame", "POST / HTTP/1.1\r\nHost: h\r\nB: 1\r\nA: 1\r\n\r\n",
			func(r *http.Request) { r.Body, r.ContentLength = io.NopCloser(strings.NewReader("x")), 1 }},
		{"trailers announced", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nB: 1\r\nA: 1\r\n\r\n0\r\n\r\n",
			func(r *http.Request) { r.Trailer = http.Header{"T": nil} }},
		{"a field name that is no token", "GET / HTTP/1.1\r\nHost: h\r\nB: 1\r\nA: 1\r\n\r\n", func(r *http.Request) { r.Header["Bad Name"] = []string{"x"} }},
		{"a non-ASCII host", "GET / HTTP/1.1\r\nHost: h\r\nB: 1\r\nA: 1\r\n\r\n", func(r *http.Request) { r.Host = "bücher.example" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := sendOn(t, tc.raw)
			tc.change(req)
			var b bytes.Buffer
			w := bufio.NewWriter(&b)
			o, _ := fieldorder.FromContext(req.Context())
			if done, _ := writeOrdered(w, req, false, o); done {
				_ = w.Flush()
				t.Fatalf("writeOrdered took it: %q", b.String())
			}
			if b.Len() != 0 || w.Buffered() != 0 {
				t.Fatal("writeOrdered declined after writing")
			}
		})
	}
}

// TestWriteOrderedAllocatesNothing: keeping the order costs no
// allocation when the head is written (the front end's recording costs
// its own, see BenchmarkHeadOrder).
func TestWriteOrderedAllocatesNothing(t *testing.T) {
	req := sendOn(t, chromiumHead)
	w := bufio.NewWriter(io.Discard)
	for _, proxy := range []bool{true, false} {
		if n := testing.AllocsPerRun(100, func() {
			if err := WriteRequest(w, req, proxy); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
		}); n != 0 {
			t.Fatalf("proxy %v: %v allocations a request, want 0", proxy, n)
		}
	}
}

// BenchmarkHeadOrder is what keeping the client's header order costs a
// request, against Go's order as before: reading a browser's head
// (net/http's parser, as the front end reads it) and writing it on (the
// site link's writer). "go" parses and writes as before; "client" also
// records the head's bytes as they are read, keeps its names in the
// request's context and writes them in order.
func BenchmarkHeadOrder(b *testing.B) {
	u, _ := url.Parse("http://site.example/p?q=1")
	for _, keep := range []bool{false, true} {
		name := "go"
		if keep {
			name = "client"
		}
		b.Run(name, func(b *testing.B) {
			src := strings.NewReader(chromiumHead)
			var rec fieldorder.Recorder
			rec.R = src
			br := bufio.NewReader(&rec)
			w := bufio.NewWriter(io.Discard)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(chromiumHead)
				br.Reset(&rec)
				if keep {
					buffered, _ := br.Peek(br.Buffered())
					rec.Start(buffered)
				}
				req, err := http.ReadRequest(br)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if keep {
					ctx = fieldorder.NewContext(ctx, rec.Stop(br.Buffered()))
				}
				req = req.WithContext(ctx)
				delete(req.Header, "Connection")
				req.URL = u
				if err := WriteRequest(w, req, false); err != nil {
					b.Fatal(err)
				}
				_ = w.Flush()
			}
		})
	}
}

// FuzzWriteOrdered: for any head net/http's parser accepts, what
// writeOrdered writes (when it takes the request) parses back to the same
// fields, values and Host, and its field lines are the client's, in the
// client's order and case, less what a proxy does not send on.
func FuzzWriteOrdered(f *testing.F) {
	f.Add(chromiumHead, false)
	f.Add("GET http://h/ HTTP/1.1\r\nHost: x\r\nCookie: a\r\nConnection: close, X-A\r\nX-A: 1\r\ncookie: b\r\n\r\n", true)
	f.Add("POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\n\r\nabc", false)
	f.Add("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", false)
	f.Fuzz(func(t *testing.T, raw string, proxy bool) {
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		req := sendOn(t, raw)
		if _, err := url.Parse("http://" + req.Host + "/"); err != nil || req.Host == "" || req.Method == http.MethodConnect {
			return // the gateway sends on only to a host it could split
		}
		if req.URL.Scheme != "http" {
			req.URL.Scheme = "http"
		}
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		o, _ := fieldorder.FromContext(req.Context())
		done, err := writeOrdered(w, req, proxy, o)
		if !done || err != nil {
			return
		}
		_ = w.Flush()
		back, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b.Bytes())))
		if err != nil {
			t.Fatalf("wrote what does not parse: %v\n%q", err, b.String())
		}
		if back.Host != req.Host {
			t.Fatalf("Host %q, want %q", back.Host, req.Host)
		}
		for k, vv := range req.Header {
			if k == "Content-Length" || k == "User-Agent" && len(vv) == 1 && vv[0] == "" {
				continue
			}
			got := back.Header[k]
			if len(got) != len(vv) {
				t.Fatalf("%s: %q, want %q\n%q", k, got, vv, b.String())
			}
		}
		// The lines written are the client's, in order, less those not
		// sent on (and Host, which a client may not have written).
		wrote := fieldorder.Parse(b.Bytes())
		var want []string
		for n := range o.Names {
			k := http.CanonicalHeaderKey(n)
			if _, ok := req.Header[k]; ok || k == "Host" {
				want = append(want, n)
			}
		}
		var got []string
		for n := range wrote.Names {
			if k := http.CanonicalHeaderKey(n); k != "Connection" && k != "Content-Length" && k != "Transfer-Encoding" {
				got = append(got, n)
			}
		}
		var wantNoFraming []string
		for _, n := range want {
			if k := http.CanonicalHeaderKey(n); k != "Content-Length" && k != "Transfer-Encoding" {
				wantNoFraming = append(wantNoFraming, n)
			}
		}
		if !slices.ContainsFunc(want, func(n string) bool { return strings.EqualFold(n, "Host") }) && len(got) > 0 {
			got = got[1:]
		}
		if strings.Join(got, "\n") != strings.Join(wantNoFraming, "\n") {
			t.Fatalf("wrote lines %q, want %q\n%q", got, wantNoFraming, b.String())
		}
	})
}

// goThenReorder writes req with net/http's writer and reorders the head
// by o, as the gateway's connection under the Transport does.
func goThenReorder(t testing.TB, req *http.Request, proxy bool) (string, error) {
	var b bytes.Buffer
	write := req.Write
	if proxy {
		write = req.WriteProxy
	}
	if err := write(&b); err != nil {
		return "", err
	}
	head, body, ok := bytes.Cut(b.Bytes(), []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("net/http wrote no head end: %q", b.String())
	}
	o, _ := fieldorder.FromContext(req.Context())
	return string(Reorder(nil, append(head, "\r\n\r\n"...), o, proxy)) + string(body), nil
}

// TestReorderPutsNetHTTPsHeadInTheClientsOrder: the cases of
// TestWriteOrderedKeepsTheClientsOrderAndNames, written by net/http and
// reordered, come out as writeOrdered writes them.
func TestReorderPutsNetHTTPsHeadInTheClientsOrder(t *testing.T) {
	for _, raw := range []string{
		chromiumHead,
		"GET http://h.example/ HTTP/1.1\r\nHost: h.example\r\nProxy-Authorization: Basic eDp5\r\nUser-Agent: curl/8\r\nAccept: */*\r\nProxy-Connection: Keep-Alive\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\nX: y\r\ncookie: b=2\r\n\r\n",
		"GET http://uri.example/ HTTP/1.1\r\nAccept: */*\r\nhost: other.example\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nAccept: */*\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST / HTTP/1.1\r\ncontent-length: 0\r\nHost: h\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\nContent-Type: text/plain\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding: chunked\r\nX: 1\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	} {
		for _, proxy := range []bool{false, true} {
			want := write(t, sendOn(t, raw), proxy)
			got, err := goThenReorder(t, sendOn(t, raw), proxy)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("proxy %v: reordered\n%q\nwriteOrdered writes\n%q", proxy, got, want)
			}
		}
	}
}

// FuzzReorder: for any head net/http's parser accepts, net/http's head
// reordered is what writeOrdered writes (when it takes the request).
func FuzzReorder(f *testing.F) {
	f.Add(chromiumHead, false)
	f.Add("GET http://h/ HTTP/1.1\r\nHost: x\r\nCookie: a\r\nConnection: close, X-A\r\nX-A: 1\r\ncookie: b\r\n\r\n", true)
	f.Add("POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 3\r\n\r\nabc", false)
	f.Fuzz(func(t *testing.T, raw string, proxy bool) {
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		req := sendOn(t, raw)
		if _, err := url.Parse("http://" + req.Host + "/"); err != nil || req.Host == "" || req.Method == http.MethodConnect {
			return
		}
		req.URL.Scheme = "http"
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		o, _ := fieldorder.FromContext(req.Context())
		if done, err := writeOrdered(w, req, proxy, o); !done || err != nil || req.Body != http.NoBody {
			return
		}
		_ = w.Flush()
		again := sendOn(t, raw)
		again.URL.Scheme = "http"
		got, err := goThenReorder(t, again, proxy)
		if err != nil {
			return
		}
		if got != b.String() {
			t.Fatalf("reordered\n%q\nwriteOrdered writes\n%q", got, b.String())
		}
	})
}
