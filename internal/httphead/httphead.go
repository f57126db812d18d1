// Package httphead writes an HTTP/1.1 request head the way net/http does,
// without net/http's allocations, for the exchanges the gateway writes on
// its own goroutine: the lean path to an http:// upstream, the lease API
// client, a MITM'd request on a tunnel's site link and a WebSocket
// handshake; or, for a request that carries the order of the head its
// client sent (internal/fieldorder), in that order and with the client's
// names (writeOrdered). It says which field names are tokens
// (ValidFieldName), the names it writes and the front end lets a request
// carry. It imports the standard library, internal/ascii and
// internal/fieldorder only.
package httphead

import (
	"bufio"
	"net/http"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
)

// maxSortedFields is how many header fields writeHead sorts on the stack;
// a request with more goes through net/http's writer.
const maxSortedFields = 48

// defaultUserAgent is what net/http's request writer sends when a request
// names no User-Agent; writeHead sends the same, so that which writer ran
// never shows on the wire.
const defaultUserAgent = "Go-http-client/1.1"

// WriteRequest writes req's head, and its body when it has one, to w (in
// absolute form for a forward proxy when proxy, else in origin form); the
// caller flushes w, its buffer on the connection. A request whose context
// carries its client's field order (fieldorder.FromContext) is written in
// that order by writeOrdered, the client's field names as written. Any
// other is written as net/http does (req.WriteProxy or req.Write): one
// without a body, the common one, by writeHead, byte for byte what
// net/http writes but without its allocations; anything else, and what
// writeOrdered declines, through net/http.
func WriteRequest(w *bufio.Writer, req *http.Request, proxy bool) error {
	if o, ok := fieldorder.FromContext(req.Context()); ok {
		if done, err := writeOrdered(w, req, proxy, o); done {
			return err
		}
	}
	if writeHead(w, req, proxy) {
		return nil
	}
	if proxy {
		return req.WriteProxy(w)
	}
	return req.Write(w)
}

// writeRequestLine writes the request line, "METHOD target HTTP/1.1" and
// its CRLF: the target in absolute form (http://host/path) to a proxy, in
// origin form (/path) to a site; an empty method is GET, as net/http's.
// It returns the method written.
func writeRequestLine(w *bufio.Writer, req *http.Request, proxy bool, host, path string, query bool) (method string) {
	method = req.Method
	if method == "" {
		method = "GET"
	}
	w.WriteString(method)
	w.WriteByte(' ')
	if proxy {
		w.WriteString("http://")
		w.WriteString(host)
	}
	w.WriteString(path)
	if query {
		w.WriteByte('?')
		w.WriteString(req.URL.RawQuery)
	}
	w.WriteString(" HTTP/1.1\r\n")
	return method
}

// writeHead writes req's head, in absolute form when proxy, byte for byte
// what net/http's writer writes, for the common request that carries no
// body: it reports false, having written nothing, for anything else (a
// body or framing of one, Close, trailers, CONNECT, an opaque URL, a
// non-http URL to a proxy, a host or field name outside the plain ASCII
// sets, more fields than it sorts on the stack). net/http's writer costs
// about six allocations a request (formatted writes, the sorted field
// list, its transfer writer) and, on a writer that is not buffered, a 4
// KiB buffer; this one none beyond what the URL's escaped path may take.
// TestWriteHeadWritesWhatNetHTTPWrites and its fuzz target hold the two
// writers to the same bytes.
func writeHead(w *bufio.Writer, req *http.Request, proxy bool) bool {
	if req.Body != nil && req.Body != http.NoBody || req.ContentLength != 0 || req.Close ||
		len(req.TransferEncoding) > 0 || req.Trailer != nil || req.URL == nil ||
		req.URL.Opaque != "" || req.Method == http.MethodConnect || proxy && req.URL.Scheme != "http" {
		return false
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if host == "" || !plainHost(host) {
		return false
	}
	path := req.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	query := req.URL.ForceQuery || req.URL.RawQuery != ""
	if hasCTL(path) || query && hasCTL(req.URL.RawQuery) {
		return false
	}
	var keys [maxSortedFields]string
	n := 0
	for k := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if n == len(keys) || !ValidFieldName(k) {
			return false
		}
		keys[n] = k
		n++
	}
	sortStrings(keys[:n])

	method := writeRequestLine(w, req, proxy, host, path, query)
	w.WriteString("Host: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	ua := defaultUserAgent
	if v, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(v) > 0 {
			ua = v[0]
		}
	}
	if ua != "" {
		writeField(w, "User-Agent", ua)
	}
	if method == "POST" || method == "PUT" || method == "PATCH" {
		// As net/http: many servers expect a length for these methods.
		w.WriteString("Content-Length: 0\r\n")
	}
	for _, k := range keys[:n] {
		for _, v := range req.Header[k] {
			writeField(w, k, v)
		}
	}
	w.WriteString("\r\n")
	return true
}

// writeField writes one field line as net/http does: CR and LF in the
// value become spaces, and surrounding ASCII space is trimmed.
func writeField(w *bufio.Writer, k, v string) {
	w.WriteString(k)
	w.WriteString(": ")
	v = trimSpace(v)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.WriteByte(c)
	}
	w.WriteString("\r\n")
}

// trimSpace trims what textproto.TrimString trims once CR and LF became
// spaces: space, tab, CR and LF at either end.
func trimSpace(s string) string {
	return strings.Trim(s, " \t\r\n")
}

// plainHost reports a host of letters, digits and the punctuation of a
// name, an IPv4 or a bracketed IPv6 address with a port: ASCII, so
// net/http's punycoding leaves it alone, without a zone (which it would
// strip), and valid as a Host field.
func plainHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '-', c == ':', c == '[', c == ']', c == '_':
		default:
			return false
		}
	}
	return true
}

// hasCTL reports a control byte, which net/http refuses in a request URI.
func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// tokenChars are the bytes of an RFC 9110 token (tchar).
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ValidFieldName reports whether s is a field name: a non-empty token.
// These are the names net/http writes (it drops others silently;
// writeHead leaves a request with one to it), and the names the front end
// lets a request carry.
func ValidFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

// sortStrings is an insertion sort: a request has a few dozen fields at
// most, and sort.Strings would take the slice to the heap.
func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
