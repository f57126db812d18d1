// Package sitelink is a mirroring MITM tunnel's own connections to its
// site (--mitm-fingerprint mirror): one TLS connection per member the
// tunnel's requests went through, speaking HTTP/1.1 (one exchange at a
// time) or HTTP/2 opened as the client's first frames said (H2Print, read
// from the client by Tap), and the bounded reading of a site's answer
// head on the gateway's own connections (HeadReader, ReadFinalHead, the
// site's verdict when it does not read: HeadFault, Trace). It dials
// nothing: the gateway's exchange stage opens a link's connection through
// a member and hands it here. Every failure of what a site said leaves
// here classified (gateway/fault).
package sitelink

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
)

// RequestWriter writes a request's head and body on a connection of the
// gateway's own (the exchange stage's writer, with its pooled buffers).
type RequestWriter interface {
	WriteRequest(c net.Conn, out *http.Request, proxy bool) error
}

// NewLink is an HTTP/1.1 link to the site through member over tc, busy
// with the request that opened it.
func NewLink(member string, tc net.Conn) *Link {
	l := &Link{member: member, c: tc, busy: true}
	l.hr = NewHeadReader(tc)
	l.br = bufio.NewReaderSize(&l.hr, 4096)
	return l
}

// NewH2Link is an HTTP/2 link to the site through member over tc, opened
// as p says.
func NewH2Link(member string, tc net.Conn, p *H2Print) (*Link, error) {
	fh, err := p.Open(tc)
	if err != nil {
		return nil, err
	}
	return &Link{member: member, c: tc, fh: fh, busy: true}, nil
}

// H2 reports whether l speaks HTTP/2.
func (l *Link) H2() bool { return l.fh != nil }

// Links are a tunnel's own site connections, by member name.
type Links struct {
	mu      sync.Mutex
	links   map[string]*Link
	opening map[string]chan struct{} // a member's first link being opened
	closed  bool
}

// Link is one TLS connection to the site through one member, speaking
// HTTP/1.1 (one exchange at a time) or HTTP/2.
type Link struct {
	member string
	c      net.Conn
	br     *bufio.Reader // HTTP/1.1, reading through hr
	hr     HeadReader    // bounds each answer head br reads
	fh     *H2Conn       // HTTP/2, opened with the client's frames (h2Print)
	busy   bool          // HTTP/1.1: an answer is being read
}

func (l *Link) Close() {
	if l.fh != nil {
		l.fh.close()
	}
	_ = l.c.Close()
}

// Take returns the member's link when it can carry a request now (an
// HTTP/1.1 one marked busy). Without one it returns wait, when another
// request is opening the member's first link (HTTP/2 carries both: one
// site connection, as a browser has), or opener: the caller opens it and
// calls opened.
func (s *Links) Take(member string) (l *Link, wait <-chan struct{}, opener bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.links[member]
	switch {
	case l == nil:
		if ch, ok := s.opening[member]; ok {
			return nil, ch, false
		}
		if s.opening == nil {
			s.opening = map[string]chan struct{}{}
		}
		s.opening[member] = make(chan struct{})
		return nil, nil, true
	case l.fh != nil:
		if l.fh.canTake() {
			return l, nil, false
		}
	case !l.busy:
		l.busy = true
		return l, nil, false
	}
	return nil, nil, false
}

// Opened ends the opening of the member's first link, which add has
// kept or which failed: the requests waiting for it look again.
func (s *Links) Opened(member string) {
	s.mu.Lock()
	if ch, ok := s.opening[member]; ok {
		close(ch)
		delete(s.opening, member)
	}
	s.mu.Unlock()
}

// Add keeps l as the member's link (replacing one that cannot take
// requests, which closes when its exchange ends); false once the client's
// connection closed.
func (s *Links) Add(l *Link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.links == nil {
		s.links = map[string]*Link{}
	}
	s.links[l.member] = l
	return true
}

// release makes an HTTP/1.1 link free for the tunnel's next request.
func (s *Links) release(l *Link) {
	s.mu.Lock()
	if s.links[l.member] == l && !s.closed {
		l.busy = false
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	l.Close()
}

// Drop closes l and forgets it.
func (s *Links) Drop(l *Link) {
	s.mu.Lock()
	if s.links[l.member] == l {
		delete(s.links, l.member)
	}
	s.mu.Unlock()
	l.Close()
}

// CloseAll closes every link: the client's connection closed.
func (s *Links) CloseAll() {
	s.mu.Lock()
	s.closed = true
	links := s.links
	s.links = nil
	s.mu.Unlock()
	for _, l := range links {
		l.Close()
	}
}

// Stale reports the error of a kept-alive connection the site had
// closed before the request reached it.
func Stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || isNoCachedConn(err)
}

// Leftover reports an answer on a kept-alive link that does not parse:
// most likely bytes the site sent after its last answer's end (a body on
// a 304, more than its Content-Length) that arrived after the link was
// given back, read as the start of this answer. The keep-alive pool
// (internal/keepalive) sends again after a stale connection the same way.
func Leftover(err error) bool {
	var mh *MalformedHead
	return errors.As(err, &mh)
}

// RoundTrip sends out on l (written by w) and returns the answer; its
// body gives the link back to s when read to its end. An answer past
// timeout is the site's answer timeout.
func (s *Links) RoundTrip(l *Link, out *http.Request, timeout time.Duration, w RequestWriter) (*http.Response, error) {
	if l.fh != nil {
		actx, cancel := context.WithCancelCause(out.Context())
		timer := time.AfterFunc(timeout, func() { cancel(fault.ErrAnswerTimeout) })
		resp, err := l.fh.roundTrip(out.WithContext(actx))
		if !timer.Stop() {
			if err == nil {
				_ = resp.Body.Close()
			}
			cancel(nil)
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		if err != nil {
			cancel(nil)
			return nil, err
		}
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	ctx := out.Context()
	stop := context.AfterFunc(ctx, func() { _ = l.c.SetDeadline(keepalive.ALongTimeAgo) })
	if err := w.WriteRequest(l.c, out, false); err != nil {
		stop()
		return nil, err
	}
	_ = l.c.SetReadDeadline(time.Now().Add(timeout))
	resp, err := ReadFinalHead(l.br, &l.hr, out)
	if err != nil {
		stop()
		if fault.IsTimeout(err) && ctx.Err() == nil {
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		// Past the site's TLS the member relays encrypted bytes only: what
		// they say is the site's.
		return nil, HeadFault(err, true)
	}
	_ = l.c.SetReadDeadline(time.Time{})
	resp.Body = &linkBody{rc: resp.Body, done: func(complete bool) {
		stop()
		// Bytes read past the answer's end (a site that sends a body on a
		// 304, or more than its Content-Length) would be read as the start
		// of the next answer: such a link is not reused.
		if complete && !resp.Close && l.br.Buffered() == 0 {
			s.release(l)
		} else {
			s.Drop(l)
		}
	}}
	return resp, nil
}

// linkBody is an HTTP/1.1 answer's body on a tunnel's link: read to its
// end it frees the link, closed early or broken it closes it.
type linkBody struct {
	rc   io.ReadCloser
	done func(complete bool)
	over bool
}

func (b *linkBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && !b.over {
		b.over = true
		b.done(err == io.EOF)
	}
	return n, err
}

// Close ends the body; unread, the link is closed rather than drained.
func (b *linkBody) Close() error {
	if !b.over {
		b.over = true
		b.done(false)
	}
	return nil
}

// cancelBody ends an HTTP/2 answer's context with its body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
