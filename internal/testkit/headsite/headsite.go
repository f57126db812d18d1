// Package headsite runs a site of the test's own, a Site, that records
// each request head byte for byte as it arrived (request line, field lines
// in their order and case, the empty line), before any HTTP parser sees
// it: what a site that fingerprints header order reads. Over TLS it offers
// http/1.1 alone in ALPN, so every client speaks HTTP/1.1 to it.
//
// It imports nothing of ours: it must judge the gateway's writer
// independently.
package headsite

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"io"
	"net"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/sitecert"
)

// maxHead bounds a recorded head; a longer one ends the connection.
const maxHead = 64 << 10

// page is every answer's body.
const page = "<!doctype html><html><head><title>heads</title></head><body>recorded</body></html>"

// Site is a loopback HTTP/1.1 site, over TLS or plain TCP, that records
// every request head as it arrived and answers each with a small page,
// keeping the connection alive.
type Site struct {
	ln      net.Listener
	tls     bool
	certPEM []byte

	mu    sync.Mutex
	heads []Head
	wg    sync.WaitGroup
}

// Head is one request head as the site received it.
type Head struct {
	// Raw is the head's bytes, up to and including the empty line.
	Raw string
	// Target is the request line's target (path, or an absolute URI).
	Target string
	// UserAgent is the first User-Agent field's value (any case of the name).
	UserAgent string
}

// Start starts a Site on host (a loopback IP), over TLS when withTLS (its
// certificate for host issued by a CA of its own, CertPEM), closed at test
// cleanup.
func Start(t testing.TB, host string, withTLS bool) *Site {
	t.Helper()
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		t.Fatalf("head site host %q must be a loopback IP", host)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Site{tls: withTLS}
	if withTLS {
		cert, caDER, err := sitecert.Issue("headsite", ip)
		if err != nil {
			t.Fatal(err)
		}
		s.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	}
	s.ln = ln
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.Close)
	return s
}

// URL is the site's base URL, without a trailing slash.
func (s *Site) URL() string {
	if s.tls {
		return "https://" + s.ln.Addr().String()
	}
	return "http://" + s.ln.Addr().String()
}

// CertPEM is the CA that issued the site's certificate (nil without TLS).
func (s *Site) CertPEM() []byte { return s.certPEM }

// Heads returns the heads received so far, in the order they arrived.
func (s *Site) Heads() []Head {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Head(nil), s.heads...)
}

// Close stops the site and waits for its connections.
func (s *Site) Close() {
	_ = s.ln.Close()
	s.wg.Wait()
}

func (s *Site) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

func (s *Site) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		raw, err := readHead(br)
		if err != nil {
			return
		}
		h := parse(raw)
		s.mu.Lock()
		s.heads = append(s.heads, h)
		s.mu.Unlock()
		if !discardBody(br, raw) {
			return
		}
		_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "+
			strconv.Itoa(len(page))+"\r\n\r\n"+page)
		if err != nil {
			return
		}
	}
}

// readHead reads up to and including the first empty line (CRLF or LF).
func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return "", err
		}
		if b.Len() > maxHead {
			return "", io.ErrShortBuffer
		}
		if line == "\r\n" || line == "\n" {
			return b.String(), nil
		}
	}
}

func parse(raw string) Head {
	lines := strings.Split(strings.TrimRight(raw, "\r\n"), "\n")
	h := Head{Raw: raw}
	if f := strings.Fields(lines[0]); len(f) > 1 {
		h.Target = f[1]
	}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		if ok && strings.EqualFold(k, "User-Agent") && h.UserAgent == "" {
			h.UserAgent = strings.TrimSpace(v)
		}
	}
	return h
}

// discardBody reads the request's body (Content-Length or chunked) and
// reports whether the connection can go on.
func discardBody(br *bufio.Reader, raw string) bool {
	var length int64
	chunked := false
	for _, l := range strings.Split(raw, "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		switch {
		case !ok:
		case strings.EqualFold(k, "Content-Length"):
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return false
			}
			length = n
		case strings.EqualFold(k, "Transfer-Encoding"):
			chunked = strings.EqualFold(strings.TrimSpace(v), "chunked")
		}
	}
	if chunked {
		if _, err := io.Copy(io.Discard, httputil.NewChunkedReader(br)); err != nil {
			return false
		}
		// Trailers, then the empty line.
		for {
			l, err := br.ReadBytes('\n')
			if err != nil {
				return false
			}
			if len(bytes.TrimRight(l, "\r\n")) == 0 {
				return true
			}
		}
	}
	_, err := io.CopyN(io.Discard, br, length)
	return err == nil
}
