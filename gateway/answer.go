package gateway

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// readAnswer is the part of resp the classifier reads. When a ban rule
// needs the body for this head, the first Options.BanBodyBytes of it are
// read ahead and put back in front of resp.Body, so the client still gets
// the answer byte for byte; otherwise nothing is read and the body streams
// as before. An error reading ahead (the site broke off, the request
// deadline passed) ends the attempt like a failed round trip.
func (x *exchange) readAnswer(r *http.Request, resp *http.Response) (rotation.Answer, error) {
	a := rotation.Answer{Status: resp.StatusCode, Header: resp.Header}
	if !x.classifier.NeedsBody(resp.StatusCode, resp.Header) || r.Method == http.MethodHead {
		return a, nil
	}
	n := int64(x.banBodyBytes)
	if resp.ContentLength >= 0 && resp.ContentLength < n {
		n = resp.ContentLength
	}
	buf := make([]byte, n)
	got, err := io.ReadFull(resp.Body, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		_ = resp.Body.Close()
		return a, err
	}
	buf = buf[:got]
	resp.Body = &prefixedBody{prefix: buf, rest: resp.Body}
	a.Body, a.BodyRead = decodedPrefix(buf, resp.Header.Get("Content-Encoding"), x.banBodyBytes), true
	return a, nil
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
	one    [1]byte // startBody's prefix, so that it allocates once
}

// startBody reads the first byte of an answer's body (or its end) before
// the attempt counts as served. A member that sent a head and broke off
// before any of its body (a Squid killed in the middle of an answer) then
// fails the attempt, which an idempotent request retries on another member
// and any other request answers as the gateway's 502, instead of leaving
// the client a closed connection and not one byte: net/http writes the
// head the gateway delivers only with the first body bytes, so nothing
// has reached the client yet. The wait is the one delivering makes anyway.
// A body readAnswer already read into is left as it is.
func startBody(resp *http.Response) error {
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

// classifySiteTLS gives a failed https:// round trip whose TLS to the site
// did not verify its verdict: the site's, certain (the gateway verified the
// chain itself, against the system roots and --upstream-ca-file), answered
// 502 site_certificate and never retried, since every member would carry
// the same certificate. A certificate that fails through an https:// member
// and names that member is the member's own (the transport verifies both
// with one configuration), so it stays a member failure.
func classifySiteTLS(err error, mc *link.Link, u *url.URL) error {
	if u.Scheme != "https" || !fault.IsCertError(err) {
		return err
	}
	var cve *tls.CertificateVerificationError
	if mc.TLSConfig != nil && errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0 &&
		cve.UnverifiedCertificates[0].VerifyHostname(mc.TLSConfig.ServerName) == nil {
		return err
	}
	return fault.SiteCertificate(u.Host, err)
}
