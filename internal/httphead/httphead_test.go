package httphead

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// heads writes req with writeHead and with net/http's writer (WriteProxy
// when proxy, else Write); fast is false when writeHead left req to
// net/http.
func heads(t testing.TB, req *http.Request, proxy bool) (got, want string, fast bool) {
	var a, b bytes.Buffer
	wa := bufio.NewWriter(&a)
	fast = writeHead(wa, req, proxy)
	_ = wa.Flush()
	if !fast && a.Len() != 0 {
		t.Fatalf("writeHead declined %v after writing %q", req.URL, a.String())
	}
	write := req.Write
	if proxy {
		write = req.WriteProxy
	}
	if err := write(&b); err != nil {
		return a.String(), "error: " + err.Error(), fast
	}
	return a.String(), b.String(), fast
}

func TestWriteHeadWritesWhatNetHTTPWrites(t *testing.T) {
	many := http.Header{}
	for i := 0; i < maxSortedFields+1; i++ {
		many["X-F"+strings.Repeat("a", i)] = []string{"v"}
	}
	tests := []struct {
		name   string
		method string
		url    string
		host   string
		header http.Header
		body   bool
		close  bool
		fast   bool
	}{
		{"a GET with fields in no order", "GET", "http://example.com/a/b?q=1", "", http.Header{"Zed": {"1"}, "Accept": {"*/*"}, "X-Two": {"a", "b"}}, false, false, true},
		{"no method is GET", "", "http://example.com/", "", nil, false, false, true},
		{"no path is /", "GET", "http://example.com", "", nil, false, false, true},
		{"an escaped path and an empty forced query", "GET", "http://example.com/a%20b/c%2Fd?", "", nil, false, false, true},
		{"the Host field wins over the URL's host", "GET", "http://example.com/", "other.example:8080", nil, false, false, true},
		{"an IPv6 literal with a port", "GET", "http://[::1]:8080/x", "", nil, false, false, true},
		{"the client's User-Agent, trimmed", "GET", "http://example.com/", "", http.Header{"User-Agent": {"  crawler/1.0\t"}}, false, false, true},
		{"an empty User-Agent sends none", "GET", "http://example.com/", "", http.Header{"User-Agent": {""}}, false, false, true},
		{"a User-Agent of spaces sends an empty one", "GET", "http://example.com/", "", http.Header{"User-Agent": {"   "}}, false, false, true},
		{"a User-Agent field without values sends none", "GET", "http://example.com/", "", http.Header{"User-Agent": {}}, false, false, true},
		{"CR and LF inside a value become spaces", "GET", "http://example.com/", "", http.Header{"X-A": {"a\r\nb", " \r\nc\n"}}, false, false, true},
		{"a bodiless POST says Content-Length 0", "POST", "http://example.com/", "", nil, false, false, true},
		{"a bodiless PUT says Content-Length 0", "PUT", "http://example.com/", "", nil, false, false, true},
		{"a bodiless PATCH says Content-Length 0", "PATCH", "http://example.com/", "", nil, false, false, true},
		{"a bodiless DELETE says no length", "DELETE", "http://example.com/", "", nil, false, false, true},
		{"framing fields are not copied", "GET", "http://example.com/", "", http.Header{"Content-Length": {"5"}, "Transfer-Encoding": {"chunked"}, "Trailer": {"X"}, "Host": {"evil"}}, false, false, true},
		{"a lower-case key is a field of its own", "GET", "http://example.com/", "", http.Header{"user-agent": {"x"}}, false, false, true},
		{"a Proxy-Authorization is sent", "GET", "http://example.com/", "", http.Header{"Proxy-Authorization": {"Basic eDp5"}}, false, false, true},
		{"a body goes to net/http", "POST", "http://example.com/", "", nil, true, false, false},
		{"Close goes to net/http", "GET", "http://example.com/", "", nil, false, true, false},
		{"CONNECT goes to net/http", "CONNECT", "http://example.com:443", "", nil, false, false, false},
		{"a non-ASCII host goes to net/http", "GET", "http://bücher.example/", "", nil, false, false, false},
		{"a zone goes to net/http", "GET", "http://[fe80::1%25eth0]:80/", "", nil, false, false, false},
		{"a host net/http refuses goes to it", "GET", "http://example.com/", "a b", nil, false, false, false},
		{"an invalid field name goes to net/http", "GET", "http://example.com/", "", http.Header{"Bad Name": {"x"}}, false, false, false},
		{"a control byte in the query goes to net/http", "GET", "http://example.com/?a\x01", "", nil, false, false, false},
		{"more fields than fit the stack go to net/http", "GET", "http://example.com/", "", many, false, false, false},
	}
	for _, tc := range tests {
		for _, proxy := range []bool{true, false} {
			name := tc.name + ", origin form"
			if proxy {
				name = tc.name + ", to a proxy"
			}
			t.Run(name, func(t *testing.T) {
				u, err := url.Parse(tc.url)
				if err != nil {
					u = &url.URL{Scheme: "http", Host: "example.com", Path: "/", RawQuery: strings.SplitN(tc.url, "?", 2)[1]}
				}
				req := &http.Request{Method: tc.method, URL: u, Host: tc.host, Header: tc.header, Close: tc.close}
				if req.Header == nil {
					req.Header = http.Header{}
				}
				if tc.body {
					req.Body, req.ContentLength = http.NoBody, 3
				}
				got, want, fast := heads(t, req, proxy)
				if fast != tc.fast {
					t.Fatalf("written by writeHead: %v, want %v", fast, tc.fast)
				}
				if fast && got != want {
					t.Fatalf("writeHead wrote\n%q\nnet/http writes\n%q", got, want)
				}
			})
		}
	}
}

func TestWriteHeadTakesAnHTTPSURLOnlyInOriginForm(t *testing.T) {
	u, _ := url.Parse("https://example.com/a")
	req := &http.Request{Method: "GET", URL: u, Header: http.Header{}}
	if _, _, fast := heads(t, req, true); fast {
		t.Fatal("an https:// URL to a proxy was written by writeHead")
	}
	got, want, fast := heads(t, req, false)
	if !fast || got != want {
		t.Fatalf("origin form of an https:// URL: written by writeHead %v, %q, want %q", fast, got, want)
	}
}

// TestWriteHeadAllocatesNothing pins the point of writeHead.
func TestWriteHeadAllocatesNothing(t *testing.T) {
	u, _ := url.Parse("http://example.com/a?b=c")
	req := &http.Request{Method: "GET", URL: u, Host: u.Host, Header: http.Header{"Accept": {"*/*"}, "User-Agent": {"c/1"}, "X-A": {"1"}}}
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

// TestWriteRequestFallsBackToNetHTTP: a request writeHead declines is
// written whole by net/http, its body included.
func TestWriteRequestFallsBackToNetHTTP(t *testing.T) {
	u, _ := url.Parse("http://example.com/up")
	req := &http.Request{Method: "POST", URL: u, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("abc")), ContentLength: 3}
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	if err := WriteRequest(w, req, false); err != nil {
		t.Fatal(err)
	}
	_ = w.Flush()
	if s := b.String(); !strings.HasPrefix(s, "POST /up HTTP/1.1\r\n") || !strings.HasSuffix(s, "\r\n\r\nabc") {
		t.Fatalf("wrote %q", s)
	}
}

// FuzzWriteHead: whatever request line and fields a client sends, the
// head writeHead writes (when it takes the request) is net/http's, to a
// proxy and in origin form.
func FuzzWriteHead(f *testing.F) {
	f.Add("GET", "http://example.com/a?b", "", "Accept", " x\r\ny ", "User-Agent", "", true)
	f.Add("POST", "https://[::1]:80/", "h:1", "user-agent", "a", "Zz", "b", false)
	f.Fuzz(func(t *testing.T, method, rawURL, host, k1, v1, k2, v2 string, proxy bool) {
		u, err := url.Parse(rawURL)
		if err != nil {
			return
		}
		req := &http.Request{Method: method, URL: u, Host: host, Header: http.Header{k1: {v1}, k2: {v2, v1}}}
		got, want, fast := heads(t, req, proxy)
		if fast && got != want {
			t.Fatalf("writeHead wrote\n%q\nnet/http writes\n%q", got, want)
		}
	})
}
