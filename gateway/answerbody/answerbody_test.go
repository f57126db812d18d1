package answerbody

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

// site is an answer body that gives its bytes, then end (io.EOF, or the
// connection's error).
func site(b []byte, end error) io.ReadCloser {
	return io.NopCloser(io.MultiReader(bytes.NewReader(b), &failing{end}))
}

type failing struct{ err error }

func (f *failing) Read([]byte) (int, error) { return 0, f.err }

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestPeekHandsTheRulesThePrefixAndTheClientEveryByte(t *testing.T) {
	page := "<html><title>Just a moment...</title>" + strings.Repeat("x", 100) + "</html>"
	zipped := gzipped(t, page)
	tests := []struct {
		name     string
		body     []byte
		encoding string
		length   int64
		limit    int
		rules    string // what Peek returns
	}{
		{name: "a plain body's prefix", body: []byte(page), length: -1, limit: 16, rules: page[:16]},
		{name: "a body shorter than the limit, whole", body: []byte("banned"), length: 6, limit: 64, rules: "banned"},
		{name: "a gzip body is searched decoded", body: zipped, encoding: "gzip", length: int64(len(zipped)), limit: 4096, rules: page},
		{name: "an encoding it cannot decode is searched as it is", body: []byte("\x1b\x00br"), encoding: "br", length: 4, limit: 64, rules: "\x1b\x00br"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{Body: site(tt.body, io.EOF), ContentLength: tt.length, Header: http.Header{}}
			if tt.encoding != "" {
				resp.Header.Set("Content-Encoding", tt.encoding)
			}
			got, err := Peek(resp, tt.limit)
			if err != nil || string(got) != tt.rules {
				t.Fatalf("Peek = %q, %v; want %q", got, err, tt.rules)
			}
			all, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(all, tt.body) {
				t.Fatalf("the client would get %q, %v; want every byte the site sent", all, err)
			}
		})
	}
	resp := &http.Response{Body: site([]byte("part"), syscall.ECONNRESET), ContentLength: -1}
	if _, err := Peek(resp, 64); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a body that broke off while read ahead: %v; want its error", err)
	}
}

func TestStartEndsTheAttemptAtTheFirstByteOfTheBody(t *testing.T) {
	tests := []struct {
		name    string
		body    io.ReadCloser
		failed  bool
		forward string
	}{
		{name: "a body keeps its first byte", body: site([]byte("hello"), io.EOF), forward: "hello"},
		{name: "an empty body is served", body: site(nil, io.EOF)},
		{name: "no body is served", body: http.NoBody},
		{name: "a reset before the first byte fails the attempt", body: site(nil, syscall.ECONNRESET), failed: true},
		{name: "a cut before the first byte fails the attempt", body: site(nil, io.ErrUnexpectedEOF), failed: true},
		{name: "a reset after the first byte is the delivery's", body: site([]byte("h"), syscall.ECONNRESET), forward: "h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{Body: tt.body}
			err := Start(resp)
			if tt.failed {
				if err == nil {
					t.Fatal("an answer that broke off before its body counts as served")
				}
				return
			}
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			var got bytes.Buffer
			_, _ = io.Copy(&got, resp.Body)
			if got.String() != tt.forward {
				t.Fatalf("delivered %q, want %q", got.String(), tt.forward)
			}
		})
	}
}
