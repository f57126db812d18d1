// Package answerbody is an answer's body as the gateway reads it before
// it delivers the answer: a prefix read ahead for the ban rules (decoded
// when the site compressed it) and put back, and the first byte that ends
// an attempt (Start). It knows nothing of members, rules or clients.
package answerbody

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
)

// Peek reads up to limit bytes of resp's body ahead (fewer when its
// length says so) and puts them back in front of resp.Body, so the client
// still gets the answer byte for byte; it returns what the rules search
// (decodedPrefix). An error reading ahead (the site broke off, the
// request deadline passed) closes the body and is returned: it ends the
// attempt like a failed round trip.
func Peek(resp *http.Response, limit int) ([]byte, error) {
	n := int64(limit)
	if resp.ContentLength >= 0 && resp.ContentLength < n {
		n = resp.ContentLength
	}
	buf := make([]byte, n)
	got, err := io.ReadFull(resp.Body, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		_ = resp.Body.Close()
		return nil, err
	}
	buf = buf[:got]
	resp.Body = &prefixedBody{prefix: buf, rest: resp.Body}
	return decodedPrefix(buf, resp.Header.Get("Content-Encoding"), limit), nil
}

// decodedPrefix is what rules search: the body prefix itself, or as much of
// it as decompresses when the site sent it gzip- or deflate-encoded (the
// gateway passes encodings through, and a crawler asks for gzip). Other
// encodings (br, zstd) are searched as they are, which a body rule will
// rarely match; see README.md.
func decodedPrefix(b []byte, encoding string, limit int) []byte {
	var zr io.Reader
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "gzip", "x-gzip":
		r, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return b
		}
		zr = r
	case "deflate":
		r, err := zlib.NewReader(bytes.NewReader(b))
		if err != nil {
			return b
		}
		zr = r
	default:
		return b
	}
	// A truncated stream still yields what it decoded so far.
	out, _ := io.ReadAll(io.LimitReader(zr, int64(limit)))
	return out
}

// prefixedBody is an answer body with its read-ahead prefix put back.
type prefixedBody struct {
	prefix []byte
	rest   io.ReadCloser
	one    [1]byte // Start's prefix, so that it allocates once
}

// Start reads the first byte of an answer's body (or its end) before
// the attempt counts as served. A member that sent a head and broke off
// before any of its body (a Squid killed in the middle of an answer) then
// fails the attempt, which an idempotent request retries on another member
// and any other request answers as the gateway's 502, instead of leaving
// the client a closed connection and not one byte: net/http writes the
// head the gateway delivers only with the first body bytes, so nothing
// has reached the client yet. The wait is the one delivering makes anyway.
// A body Peek already read into is left as it is.
func Start(resp *http.Response) error {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	if _, read := resp.Body.(*prefixedBody); read {
		return nil
	}
	pb := &prefixedBody{rest: resp.Body}
	for range 8 { // a Reader may return 0, nil; a few times is its right
		n, err := resp.Body.Read(pb.one[:])
		if n > 0 {
			pb.prefix = pb.one[:n]
			resp.Body = pb
			return nil
		}
		if err == io.EOF {
			return nil // an empty body: later reads end at once too
		}
		if err != nil {
			_ = resp.Body.Close()
			return err
		}
	}
	resp.Body = pb
	return nil
}

func (b *prefixedBody) Read(p []byte) (int, error) {
	if len(b.prefix) > 0 {
		n := copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		return n, nil
	}
	return b.rest.Read(p)
}

func (b *prefixedBody) Close() error { return b.rest.Close() }
