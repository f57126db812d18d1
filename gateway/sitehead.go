package gateway

import (
	"bufio"
	"errors"
	"io"
	"net/http"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// Two paths read a site's answer head with http.ReadResponse on the
// gateway's own connection, where neither net/http's Transport
// (MaxResponseHeaderBytes) nor the lean exchange (keepalive's Limit)
// bounds it: a MITM tunnel's site links (sitelink.go) and a WebSocket
// handshake (upgrade.go). textproto reads header lines for as long as they
// come, so both read through a headReader, armed for one answer head.

// classProtocol is the failure class of a site answer the gateway could
// not read as HTTP: a head larger than maxResponseHead.
const classProtocol = "protocol"

// headReader is what a site connection's bufio.Reader reads through: armed,
// it fails with errHeadTooLarge once maxResponseHead bytes were read (the
// same bound as the lean path's and the Transport's, 1xx heads included);
// lifted, it reads without bound (an answer's body, a relayed socket).
type headReader struct {
	r io.Reader
	n int64 // bytes left before errHeadTooLarge; < 0: not armed
}

// newHeadReader returns a lifted headReader over r.
func newHeadReader(r io.Reader) headReader { return headReader{r: r, n: -1} }

func (h *headReader) Read(p []byte) (int, error) {
	if h.n < 0 {
		return h.r.Read(p)
	}
	if h.n == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > h.n {
		p = p[:h.n]
	}
	n, err := h.r.Read(p)
	h.n -= int64(n)
	return n, err
}

// arm bounds what is read from now on to maxResponseHead bytes.
func (h *headReader) arm() { h.n = maxResponseHead }

// lift ends the bound and reports whether it was reached.
func (h *headReader) lift() (reached bool) {
	reached = h.n == 0
	h.n = -1
	return reached
}

// readFinalHead reads the answer to out from br, which reads through h:
// interim 1xx answers are skipped (101 is final), and the whole head, the
// interim ones included, is bounded. A head cut by the bound is
// errHeadTooLarge whatever the parser made of the cut (a line cut in its
// name reads as "missing colon").
func readFinalHead(br *bufio.Reader, h *headReader, out *http.Request) (*http.Response, error) {
	h.arm()
	for {
		resp, err := http.ReadResponse(br, out)
		if err != nil {
			if h.lift() {
				return nil, errHeadTooLarge
			}
			return nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			h.lift()
			return resp, nil
		}
	}
}

// siteHeadFault gives the failure to read a site's answer head its
// verdict: a head larger than the bound is the site's. firsthand: the
// gateway spoke to the site itself (over its own TLS to it, which the
// member only relays encrypted, or from a direct member's address), so
// another member would read the same head and none is tried. Any other
// error is returned as it is.
func siteHeadFault(err error, firsthand bool) error {
	if errors.Is(err, errHeadTooLarge) {
		return &attemptError{f: rotation.Site(classProtocol), firsthand: firsthand,
			err: &annotated{err: err, msg: "the site's answer head is larger than 1 MiB"}}
	}
	return err
}
