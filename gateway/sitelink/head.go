package sitelink

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Two paths read a site's answer head with http.ReadResponse on the
// gateway's own connection, where neither net/http's Transport
// (MaxResponseHeaderBytes) nor the lean exchange (keepalive's Limit)
// bounds it: a MITM tunnel's site links (sitelink.go) and a WebSocket
// handshake (upgrade.go). textproto reads header lines for as long as they
// come, so both read through a HeadReader, armed for one answer head.

// ClientHeadMax is the largest request head the gateway reads from a
// client (its servers' MaxHeaderBytes, Squid's request_header_max_size):
// a client's first HEADERS is read to at most that.
const ClientHeadMax = 64 << 10

// ClassProtocol is the failure class of a site answer the gateway could
// not read as HTTP: a head larger than link.MaxResponseHead, or one that does
// not parse (a garbled status line, two different Content-Lengths).
const ClassProtocol = "protocol"

// HeadReader is what a site connection's bufio.Reader reads through: armed,
// it fails with link.ErrHeadTooLarge once link.MaxResponseHead bytes were read (the
// same bound as the lean path's and the Transport's, 1xx heads included);
// lifted, it reads without bound (an answer's body, a relayed socket). It
// also notes whether the connection itself failed while armed, which
// tells a head that does not parse from a connection that broke.
type HeadReader struct {
	r      io.Reader
	n      int64 // bytes left before link.ErrHeadTooLarge; < 0: not armed
	failed bool  // the connection returned an error (io.EOF included) since arm
}

// NewHeadReader returns a lifted HeadReader over r.
func NewHeadReader(r io.Reader) HeadReader { return HeadReader{r: r, n: -1} }

func (h *HeadReader) Read(p []byte) (int, error) {
	if h.n < 0 {
		return h.r.Read(p)
	}
	if h.n == 0 {
		return 0, link.ErrHeadTooLarge
	}
	if int64(len(p)) > h.n {
		p = p[:h.n]
	}
	n, err := h.r.Read(p)
	h.n -= int64(n)
	if err != nil {
		h.failed = true
	}
	return n, err
}

// arm bounds what is read from now on to link.MaxResponseHead bytes.
func (h *HeadReader) arm() { h.n, h.failed = link.MaxResponseHead, false }

// lift ends the bound and reports whether it was reached.
func (h *HeadReader) lift() (reached bool) {
	reached = h.n == 0
	h.n = -1
	return reached
}

// ReadFinalHead reads the answer to out from br, which reads through h:
// interim 1xx answers are skipped (101 is final), and the whole head, the
// interim ones included, is bounded. A head cut by the bound is
// link.ErrHeadTooLarge whatever the parser made of the cut (a line cut in its
// name reads as "missing colon"); a head the connection delivered whole
// that does not parse is a *MalformedHead.
func ReadFinalHead(br *bufio.Reader, h *HeadReader, out *http.Request) (*http.Response, error) {
	h.arm()
	for {
		resp, err := http.ReadResponse(br, out)
		if err != nil {
			failed := h.failed
			switch {
			case h.lift():
				return nil, link.ErrHeadTooLarge
			case !failed:
				// net/http's parse errors have no type of their own: an
				// error while the connection delivered every byte asked
				// of it is one.
				return nil, &MalformedHead{Err: err}
			}
			return nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			h.lift()
			return resp, nil
		}
	}
}

// MalformedHead is an answer head that does not parse as HTTP/1.1 although
// the connection delivered it: what was said, not how it travelled.
type MalformedHead struct{ Err error }

func (e *MalformedHead) Error() string { return "malformed answer: " + e.Err.Error() }
func (e *MalformedHead) Unwrap() error { return e.Err }

// HeadFault gives the failure to read a site's answer head its
// verdict: a head larger than the bound, or one that does not parse, is
// the site's. firsthand: the
// gateway spoke to the site itself (over its own TLS to it, which the
// member only relays encrypted, or from a direct member's address), so
// another member would read the same head and none is tried. Any other
// error is returned as it is.
func HeadFault(err error, firsthand bool) error {
	var mh *MalformedHead
	switch {
	case errors.Is(err, link.ErrHeadTooLarge):
		return &fault.Attempt{F: rotation.Site(ClassProtocol), Firsthand: firsthand,
			Err: &fault.Annotated{Err: err, Msg: "the site's answer head is larger than 1 MiB"}}
	case errors.As(err, &mh):
		return &fault.Attempt{F: rotation.Site(ClassProtocol), Firsthand: firsthand,
			Err: &fault.Annotated{Err: err, Msg: "the site's " + mh.Error()}}
	}
	return err
}

// Trace follows one round trip through a member's Transport to an
// https:// URL, where the Transport speaks TLS to the site itself through
// the member's CONNECT (a MITM'd tunnel under the go fingerprint, an
// https:// absolute URI). Once it has its connection (the CONNECT answered
// and the TLS handshake done: GotConn comes after both) and the request is
// written, a failure that is no connection failure is what the site said:
// a head that does not parse, or one past MaxResponseHeaderBytes. The
// member only relays encrypted bytes there, so neither is its fault.
type Trace struct{ conn, wrote atomic.Bool }

func (st *Trace) ClientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { st.conn.Store(true) },
		WroteRequest: func(w httptrace.WroteRequestInfo) { st.wrote.Store(w.Err == nil) },
	}
}

// transportHeadTooLarge is how net/http's Transport words an answer head
// past MaxResponseHeaderBytes (it has no error value of its own).
const transportHeadTooLarge = "server response headers exceeded"

// Verdict gives err, the failed round trip st followed (nil: none), its
// verdict: the site's, firsthand (siteHeadFault), when the site's answer
// was being read and the connection itself did not fail; else err as it is.
func (st *Trace) Verdict(ctx context.Context, err error) error {
	if st == nil || !st.conn.Load() || !st.wrote.Load() || ctx.Err() != nil || connFailure(err) {
		return err
	}
	if strings.Contains(err.Error(), transportHeadTooLarge) {
		return HeadFault(link.ErrHeadTooLarge, true)
	}
	return HeadFault(&MalformedHead{Err: err}, true)
}

// connFailure reports whether err is a connection's failure rather than
// something said on it: a close or a reset, a timeout, a broken TLS record
// (a relay that changed a byte), a cancelled attempt, or the Transport's
// word for a kept connection the far end had closed.
func connFailure(err error) bool {
	var (
		ne  net.Error
		rhe tls.RecordHeaderError
		no  syscall.Errno
	)
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &ne) || errors.As(err, &rhe) || errors.As(err, &no) ||
		strings.Contains(err.Error(), "server closed idle connection")
}
