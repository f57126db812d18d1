// Package fieldorder keeps what net/http's parser forgets of an HTTP/1.1
// request head: the order of its field lines and the case of their names,
// as the client wrote them. net/http reads a head into http.Header, a map
// keyed in canonical case, and every writer then sends the fields in an
// order of its own (Go's: Host, User-Agent, the rest sorted), which a site
// that fingerprints header order reads as readily as a TLS hello. The
// gateway's front end records each head's bytes as they are read
// (Recorder), keeps the names (Parse) in the request's context
// (NewContext), and internal/httphead writes the fields of the request it
// sends on in that order, with those names.
//
// It imports the standard library and internal/ascii only.
package fieldorder

import (
	"context"
	"io"
	"strings"
	"sync"

	"github.com/proxyfleet/proxyfleet/internal/ascii"
)

// Order is one request head's field names in the order and case the
// client wrote them (a name written twice is there twice), and the
// connection persistence options its Connection field carried. The zero
// Order has no fields.
type Order struct {
	// names is each field line's name followed by '\n'; one string, so an
	// Order costs one allocation however many fields the head has.
	names string
	// conn is the Connection field's keep-alive and close options as
	// written ("keep-alive", "Keep-Alive", "close"), ", " between two.
	conn string
}

// Names calls yield with each field name in order, until it returns false.
func (o Order) Names(yield func(name string) bool) {
	for s := o.names; s != ""; {
		i := strings.IndexByte(s, '\n')
		if !yield(s[:i]) {
			return
		}
		s = s[i+1:]
	}
}

// Len is the number of field lines.
func (o Order) Len() int { return strings.Count(o.names, "\n") }

// Connection is the persistence options (keep-alive, close) the client's
// Connection field carried, as written, "" for none. They are all of the
// field a proxy may send on as its own (RFC 9110 7.6.1): every other
// option names a field of the client's hop.
func (o Order) Connection() string { return o.conn }

// Parse reads the field names of head, a request head as net/http's
// parser accepted it: the request line, field lines, the empty line (CRLF
// or a bare LF ending each). A line that starts with a space or a tab
// continues the field before it (obsolete line folding) and names none.
// Parse stops at the empty line, or at the end of head, and never fails:
// a line without a colon (which the parser would have refused) is not a
// field.
func Parse(head []byte) Order {
	first := true
	var b strings.Builder
	// The Connection values, kept aside (a head has one or two) so their
	// options go into the same string as the names, after them.
	var conn [4][]byte
	nconn := 0
	for len(head) > 0 {
		line := head
		if i := indexLF(head); i >= 0 {
			line, head = head[:i], head[i+1:]
		} else {
			head = nil
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if first {
			first = false // the request line
			continue
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		colon := indexColon(line)
		if colon <= 0 {
			continue
		}
		if b.Cap() == 0 {
			b.Grow(len(line) + 16*10)
		}
		b.Write(line[:colon])
		b.WriteByte('\n')
		if nconn < len(conn) && ascii.EqualFold(line[:colon], "Connection") {
			conn[nconn] = line[colon+1:]
			nconn++
		}
	}
	n := b.Len()
	for _, v := range conn[:nconn] {
		persistence(&b, n, v)
	}
	s := b.String()
	return Order{names: s[:n], conn: s[n:]}
}

// persistence writes to b the keep-alive and close options of one
// Connection field value v, as written, ", " before each but one that
// starts b past from.
func persistence(b *strings.Builder, from int, v []byte) {
	for len(v) > 0 {
		tok := v
		if i := indexComma(v); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		tok = trimOWS(tok)
		if ascii.EqualFold(tok, "keep-alive") || ascii.EqualFold(tok, "close") {
			if b.Len() > from {
				b.WriteString(", ")
			}
			b.Write(tok)
		}
	}
}

func indexLF(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}

func indexColon(b []byte) int {
	for i, c := range b {
		if c == ':' {
			return i
		}
	}
	return -1
}

func indexComma(b []byte) int {
	for i, c := range b {
		if c == ',' {
			return i
		}
	}
	return -1
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

type ctxKey struct{}

// NewContext returns ctx carrying o: a request whose context carries an
// Order is written with its fields in that order (internal/httphead).
func NewContext(ctx context.Context, o Order) context.Context {
	return context.WithValue(ctx, ctxKey{}, o)
}

// FromContext returns the Order ctx carries, ok false when none.
func FromContext(ctx context.Context) (o Order, ok bool) {
	o, ok = ctx.Value(ctxKey{}).(Order)
	return o, ok
}

// maxKept is the largest recording buffer handed back for reuse: a head
// near the 1 MiB limit is read once in a long while, and its buffer is
// let go rather than kept by the pool.
const maxKept = 64 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// Recorder is an io.Reader over R that, between Start and Stop, keeps a
// copy of what is read: put under the bufio.Reader a request head is
// parsed from, it sees the head's bytes as the client sent them. It
// holds no buffer outside a recording (one from a pool, taken by Start and
// given back by Stop), so an idle connection costs nothing for it. What
// it keeps is bounded by what R lets through: the front end reads a head
// through a limit (the 1 MiB head bound).
type Recorder struct {
	R   io.Reader
	buf *[]byte
}

// Read implements io.Reader.
func (r *Recorder) Read(p []byte) (int, error) {
	n, err := r.R.Read(p)
	if r.buf != nil && n > 0 {
		*r.buf = append(*r.buf, p[:n]...)
	}
	return n, err
}

// Start begins a recording with buffered, the bytes the reader above has
// read already but not yet handed out (bufio.Reader.Peek of its Buffered
// count): the head starts with them.
func (r *Recorder) Start(buffered []byte) {
	if r.buf == nil {
		r.buf = bufs.Get().(*[]byte)
	}
	*r.buf = append((*r.buf)[:0], buffered...)
}

// Stop ends the recording and returns the field order of the head it
// holds: everything recorded but the last unread bytes, which the reader
// above read ahead and has not handed out (its Buffered count after the
// head was parsed).
func (r *Recorder) Stop(unread int) Order {
	if r.buf == nil {
		return Order{}
	}
	b := *r.buf
	o := Parse(b[:max(len(b)-unread, 0)])
	r.Abort()
	return o
}

// Abort ends the recording, keeping nothing.
func (r *Recorder) Abort() {
	if r.buf == nil {
		return
	}
	if cap(*r.buf) <= maxKept {
		*r.buf = (*r.buf)[:0]
		bufs.Put(r.buf)
	}
	r.buf = nil
}
