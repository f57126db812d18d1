package gateway

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"

	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
	"github.com/proxyfleet/proxyfleet/internal/httphead"
)

// A request the gateway writes itself (the lean path, a MITM'd request on
// a tunnel's site link, a WebSocket handshake) goes out with its client's
// field order and names (internal/httphead, from the order the front end
// kept: internal/fieldorder). A plain-HTTP request left to a member's
// Transport (one with a body, or through a direct or SOCKS member) is
// written by net/http, in Go's order: the connection under the Transport,
// an orderConn, puts that head back in the client's order as it is
// written. The Transport says which connection a request got
// (httptrace's GotConn) before it writes the request on it, and a
// connection carries one request at a time, so the head that follows is
// that request's.

// orderConn is a connection of a member's Transport that, armed for a
// request, rewrites the next request head written on it into the
// client's order (httphead.Reorder), and passes everything else through.
type orderConn struct {
	net.Conn
	mu    sync.Mutex
	armed bool
	o     fieldorder.Order
	proxy bool
	head  *[]byte // the armed head so far (from headBufs)
}

// headBufs hold heads being rewritten, and the rewritten ones, between
// arm and the head's last Write: a pooled connection holds none.
var headBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// putHeadBuf hands b back, unless a rare large head grew it.
func putHeadBuf(b *[]byte) {
	if cap(*b) <= 64<<10 {
		*b = (*b)[:0]
		headBufs.Put(b)
	}
}

// errOrderedHeadTooLarge is a head net/http wrote that grew past any the
// front end lets in: it is not sent (half a head would be).
var errOrderedHeadTooLarge = errors.New("request head larger than the gateway sends")

// maxOrderedHead bounds the head an orderConn holds: the front end's head
// limit plus what the Transport adds.
const maxOrderedHead = 1<<20 + 64<<10

// wrapOrder puts an orderConn over a Transport's dialed connection.
func wrapOrder(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return &orderConn{Conn: c}, nil
}

// arm makes the next head written the client's of o (in absolute form
// when proxy).
func (c *orderConn) arm(o fieldorder.Order, proxy bool) {
	c.mu.Lock()
	c.armed, c.o, c.proxy = true, o, proxy
	if c.head == nil {
		c.head = headBufs.Get().(*[]byte)
	}
	*c.head = (*c.head)[:0]
	c.mu.Unlock()
}

func (c *orderConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.armed {
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	head := append(*c.head, p...)
	*c.head = head
	end := bytes.Index(head, []byte("\r\n\r\n"))
	if end < 0 {
		tooLarge := len(head) > maxOrderedHead
		c.mu.Unlock()
		if tooLarge {
			return 0, errOrderedHeadTooLarge
		}
		return len(p), nil
	}
	ob := headBufs.Get().(*[]byte)
	out := httphead.Reorder((*ob)[:0], head[:end+4], c.o, c.proxy)
	out = append(out, head[end+4:]...)
	*ob = out
	putHeadBuf(c.head)
	c.armed, c.head = false, nil
	c.mu.Unlock()
	_, err := c.Conn.Write(out)
	putHeadBuf(ob)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// orderArmer arms the connection a request gets: its trace's GotConn.
type orderArmer struct {
	trace httptrace.ClientTrace
	o     fieldorder.Order
	proxy bool
}

func (a *orderArmer) gotConn(info httptrace.GotConnInfo) {
	if oc, ok := info.Conn.(*orderConn); ok {
		oc.arm(a.o, a.proxy)
	}
}

// withOrder returns out with a trace that arms its connection when out
// carries its client's field order and goes to the Transport as plain
// HTTP through mc (over TLS the head is above the connection: it keeps
// Go's order). proxy is whether mc is an HTTP proxy, which gets the
// request in absolute form. Four allocations a request, on the
// Transport's path only.
func withOrder(out *http.Request, mc *memberConn) *http.Request {
	if out.URL.Scheme != "http" {
		return out
	}
	o, ok := fieldorder.FromContext(out.Context())
	if !ok {
		return out
	}
	a := &orderArmer{o: o, proxy: !mc.m.Direct() && !mc.socks5}
	a.trace.GotConn = a.gotConn
	return out.WithContext(httptrace.WithClientTrace(out.Context(), &a.trace))
}
