package httphead

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/ascii"
	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
)

// maxOrderedFields bounds the field lines writeOrdered keeps in the
// client's order: it pairs each line with its value by counting the lines
// before it, which grows with the square of their number. A head with
// more (no browser or library writes 100) is written in Go's order.
const maxOrderedFields = 128

// writeOrdered writes req's head, and its body, to w with its fields in o,
// the order and name case of the head the client sent (fieldorder), and
// reports false, having written nothing, for a request it leaves to the
// other writers: a CONNECT, an opaque URL, a non-http URL to a proxy, a
// host or path net/http would rewrite or refuse, a field name that is no
// token, trailers announced before the body, a body of unknown length,
// framing the client did not write, more fields than it keeps in order.
//
// What goes where:
//   - every field of req.Header the client wrote, at the place of the
//     client's line and with its name as written: the k-th line of a name
//     carries the k-th value req.Header has for it;
//   - Host at the client's Host line (first, if it wrote none), with
//     req.Host: for a request in absolute form, the URI's (RFC 9112 3.2.2);
//   - the framing the request is sent with (Content-Length: n, or
//     Transfer-Encoding: chunked) at the first of the client's
//     Content-Length or Transfer-Encoding lines, which may differ from
//     what the client sent (a short chunked body read whole goes with its
//     length); a request without a body carries Content-Length: 0 only if
//     the client wrote it (net/http adds one to every POST);
//   - Connection: the request's own (a WebSocket handshake's, put back
//     by the gateway), else the persistence options the client's carried
//     (keep-alive, close; RFC 9110 7.6.1 lets a proxy send its own options
//     for the next hop, and these are the ones the gateway's link honours),
//     close not to a proxy (it would end the pooled link to the member,
//     and a proxy sends the site its own);
//   - fields the client did not write (the member's Proxy-Authorization),
//     or values beyond its lines, after the client's, sorted as net/http
//     sorts; an empty User-Agent the client did not write is none, as for
//     writeHead.
//
// Field lines a proxy must not forward (hop-by-hop, named by Connection,
// the gateway's own) are not in req.Header and are not written.
func writeOrdered(w *bufio.Writer, req *http.Request, proxy bool, o fieldorder.Order) (bool, error) {
	if req.URL == nil || req.URL.Opaque != "" || req.Method == http.MethodConnect || req.Close ||
		proxy && req.URL.Scheme != "http" || len(req.Trailer) > 0 {
		return false, nil
	}
	var l lines
	if !l.fill(o) {
		return false, nil
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	chunked := false
	switch {
	case len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked":
		chunked = hasBody
		if !hasBody {
			return false, nil
		}
	case len(req.TransferEncoding) > 0:
		return false, nil
	case hasBody && req.ContentLength < 0:
		chunked = true
	case hasBody && req.ContentLength == 0:
		// net/http reads a byte to tell an empty body from one of
		// unknown length: left to it.
		return false, nil
	}
	framed := l.count("Content-Length", l.n) > 0 || l.count("Transfer-Encoding", l.n) > 0
	if hasBody && !framed {
		return false, nil
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if host == "" || !plainHost(host) {
		return false, nil
	}
	path := req.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	query := req.URL.ForceQuery || req.URL.RawQuery != ""
	if hasCTL(path) || query && hasCTL(req.URL.RawQuery) || path[0] != '/' && (proxy || path != "*") {
		return false, nil
	}
	// The fields the client's lines do not carry, written after them.
	var rest [maxSortedFields]string
	n := 0
	for k, vv := range req.Header {
		if !ValidFieldName(k) {
			return false, nil
		}
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		case "Connection":
			if l.count(k, l.n) > 0 {
				continue
			}
		}
		if len(vv) > l.count(k, l.n) {
			if n == len(rest) {
				return false, nil
			}
			rest[n] = k
			n++
		}
	}
	sortStrings(rest[:n])

	writeRequestLine(w, req, proxy, host, path, query)
	if l.count("Host", l.n) == 0 {
		writeField(w, "Host", host)
	}
	wroteHost, wroteFraming, wroteConn := false, false, false
	var kb [128]byte
	for i, name := range l.name[:l.n] {
		// Compared and looked up as string(key) in place: no allocation.
		key := canonicalKey(&kb, name)
		switch {
		case string(key) == "Host":
			if !wroteHost {
				wroteHost = true
				writeField(w, name, host)
			}
			continue
		case string(key) == "Content-Length" || string(key) == "Transfer-Encoding":
			if !wroteFraming {
				wroteFraming = true
				writeFraming(w, name, string(key) == "Content-Length", req.ContentLength, chunked, hasBody)
			}
			continue
		case string(key) == "Trailer":
			continue
		case string(key) == "Connection":
			if !wroteConn {
				wroteConn = true
				writeConnection(w, name, req.Header["Connection"], o.Connection(), proxy)
			}
			continue
		}
		vv := req.Header[string(key)]
		if j := l.count(name, i); j < len(vv) {
			writeField(w, name, vv[j])
		}
	}
	for _, k := range rest[:n] {
		vv := req.Header[k]
		for _, v := range vv[min(l.count(k, l.n), len(vv)):] {
			if k == "User-Agent" && v == "" {
				continue
			}
			writeField(w, k, v)
		}
	}
	w.WriteString("\r\n")
	if !hasBody {
		return true, nil
	}
	return true, writeBody(w, req, chunked)
}

// lines are an Order's field names, in an array on the writer's stack.
type lines struct {
	n    int
	name [maxOrderedFields]string
}

// fill takes o's names; false when there are more than it holds.
func (l *lines) fill(o fieldorder.Order) bool {
	ok := true
	o.Names(func(name string) bool {
		if l.n == len(l.name) {
			ok = false
			return false
		}
		l.name[l.n] = name
		l.n++
		return true
	})
	return ok
}

// count is how many of the first n names are name, ASCII case ignored.
func (l *lines) count(name string, n int) int {
	c := 0
	for _, s := range l.name[:n] {
		if ascii.EqualFold(s, name) {
			c++
		}
	}
	return c
}

// canonicalKey is name in textproto's canonical case, made in kb (no
// allocation) when it fits. name is a token (the front end refuses any
// other), which textproto canonicalizes this way.
func canonicalKey(kb *[128]byte, name string) []byte {
	if len(name) > len(kb) {
		return []byte(textproto.CanonicalMIMEHeaderKey(name))
	}
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		kb[i] = c
		upper = c == '-'
	}
	return kb[:len(name)]
}

// writeFraming writes the request's framing at the client's first framing
// line (name; isCL when it is a Content-Length line): the client's name
// when it names what is written, the canonical one otherwise.
func writeFraming(w *bufio.Writer, name string, isCL bool, length int64, chunked, hasBody bool) {
	switch {
	case chunked:
		if isCL {
			name = "Transfer-Encoding"
		}
		writeField(w, name, "chunked")
	case hasBody || length > 0 || isCL:
		if !isCL {
			name = "Content-Length"
		}
		w.WriteString(name)
		w.WriteString(": ")
		writeInt(w, max(length, 0))
		w.WriteString("\r\n")
	}
}

// writeInt writes n (≥ 0) in decimal, a byte at a time: a buffer handed
// to the writer would escape to the heap.
func writeInt(w *bufio.Writer, n int64) {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	for _, c := range b[i:] {
		w.WriteByte(c)
	}
}

// writeConnection writes the Connection line at the client's: the
// request's own values (set by the gateway), else the client's
// persistence options (opts), leaving close out towards a proxy.
func writeConnection(w *bufio.Writer, name string, own []string, opts string, proxy bool) {
	if len(own) > 0 {
		for _, v := range own {
			writeField(w, name, v)
		}
		return
	}
	if opts == "" || proxy && hasClose(opts) {
		return
	}
	writeField(w, name, opts)
}

// hasClose reports a close option in opts (persistence options, ", "
// between two).
func hasClose(opts string) bool {
	for tok := range strings.SplitSeq(opts, ",") {
		if strings.EqualFold(strings.TrimSpace(tok), "close") {
			return true
		}
	}
	return false
}

// writeBody writes req's body after its head as net/http would: exactly
// ContentLength bytes (more or fewer is an error), or chunked with the
// trailers the body's reader filled in; the body is closed.
func writeBody(w *bufio.Writer, req *http.Request, chunked bool) (err error) {
	defer func() {
		if cerr := req.Body.Close(); err == nil {
			err = cerr
		}
	}()
	if chunked {
		cw := httputil.NewChunkedWriter(w)
		if _, err := io.Copy(cw, req.Body); err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
		if req.Trailer != nil {
			if err := req.Trailer.Write(w); err != nil {
				return err
			}
		}
		_, err := w.WriteString("\r\n")
		return err
	}
	n, err := io.CopyN(w, req.Body, req.ContentLength)
	if err == io.EOF {
		return errors.New("http: ContentLength=" + strconv.FormatInt(req.ContentLength, 10) + " with Body length " + strconv.FormatInt(n, 10))
	}
	if err != nil {
		return err
	}
	var one [1]byte
	if m, _ := io.ReadFull(req.Body, one[:]); m > 0 {
		return errors.New("http: ContentLength=" + strconv.FormatInt(req.ContentLength, 10) + " with a longer Body")
	}
	return nil
}

// Reorder appends to dst head, a request head as net/http's writer wrote
// it (request line, field lines, the empty line; CRLF), with its field
// lines in o's order and with o's names, by the rules of writeOrdered:
// the k-th line of a name the client wrote carries the k-th line net/http
// wrote for it; Host and the framing at the client's places; Connection
// at the client's (net/http's own line, else the client's persistence
// options, close not to a proxy); lines the client did not write after
// its own, in net/http's order. It is for the requests the gateway leaves
// to net/http's Transport (a body, a direct or SOCKS member), whose
// writer keeps no order: the connection under the Transport rewrites the
// head it is given (gateway's orderConn). A head with more field lines
// than it keeps in order is appended as it is.
func Reorder(dst, head []byte, o fieldorder.Order, proxy bool) []byte {
	var l lines
	var goLines [maxOrderedFields][]byte
	end := bytes.Index(head, crlf)
	if end < 0 || !l.fill(o) {
		return append(dst, head...)
	}
	dst = append(dst, head[:end+2]...)
	rest := bytes.TrimSuffix(head[end+2:], crlf)
	n := 0
	for len(rest) > 0 {
		line := rest
		if i := bytes.Index(rest, crlf); i >= 0 {
			line, rest = rest[:i], rest[i+2:]
		} else {
			rest = nil
		}
		if len(line) == 0 {
			continue
		}
		if n == len(goLines) {
			return append(dst[:len(dst)-end-2], head...)
		}
		goLines[n] = line
		n++
	}
	var used [maxOrderedFields]bool
	// take marks and returns the k-th of net/http's lines named name
	// (ASCII case ignored), its value after ": ".
	take := func(name string, k int) ([]byte, bool) {
		for i, gl := range goLines[:n] {
			colon := bytes.IndexByte(gl, ':')
			if colon < 0 || !ascii.EqualFold(gl[:colon], name) {
				continue
			}
			if k > 0 {
				k--
				continue
			}
			used[i] = true
			return bytes.TrimLeft(gl[colon+1:], " "), true
		}
		return nil, false
	}
	line := func(name string, v []byte) {
		dst = append(dst, name...)
		dst = append(dst, ": "...)
		dst = append(dst, v...)
		dst = append(dst, crlf...)
	}
	if l.count("Host", l.n) == 0 {
		if v, ok := take("Host", 0); ok {
			line("Host", v)
		}
	}
	wroteFraming, wroteConn := false, false
	for i, name := range l.name[:l.n] {
		switch {
		case ascii.EqualFold(name, "Content-Length") || ascii.EqualFold(name, "Transfer-Encoding"):
			if wroteFraming {
				continue
			}
			wroteFraming = true
			for _, f := range [2]string{"Content-Length", "Transfer-Encoding"} {
				if v, ok := take(f, 0); ok {
					if ascii.EqualFold(name, f) {
						f = name
					}
					line(f, v)
				}
			}
		case ascii.EqualFold(name, "Connection"):
			if wroteConn {
				continue
			}
			wroteConn = true
			if v, ok := take("Connection", 0); ok {
				line(name, v)
			} else if opts := o.Connection(); opts != "" && !(proxy && hasClose(opts)) {
				dst = append(dst, name...)
				dst = append(dst, ": "...)
				dst = append(dst, opts...)
				dst = append(dst, crlf...)
			}
		case ascii.EqualFold(name, "Trailer"):
		default:
			k := l.count(name, i)
			if k > 0 && ascii.EqualFold(name, "Host") {
				continue
			}
			if v, ok := take(name, k); ok {
				line(name, v)
			}
		}
	}
	for i, gl := range goLines[:n] {
		if !used[i] && !(!wroteFraming && string(gl) == "Content-Length: 0") {
			// (net/http adds a zero length to every bodiless POST, PUT
			// and PATCH; the client wrote none.)
			dst = append(dst, gl...)
			dst = append(dst, crlf...)
		}
	}
	return append(dst, crlf...)
}

var crlf = []byte("\r\n")
