// Package bufpool recycles the 4 KiB bufio readers and writers of
// connections that come and go by the thousand (a proxy's client
// connections, upstream CONNECT answers): an idle tunnel then holds none.
// It imports nothing of proxyfleet's.
package bufpool

import (
	"bufio"
	"io"
	"sync"
)

// Size is every reader's and writer's buffer.
const Size = 4096

// Readers recycles readers; the zero value is ready.
type Readers struct{ p sync.Pool }

// Get returns a reader of r.
func (rp *Readers) Get(r io.Reader) *bufio.Reader {
	if br, ok := rp.p.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, Size)
}

// Put hands br back; it must not be used after.
func (rp *Readers) Put(br *bufio.Reader) {
	br.Reset(nil)
	rp.p.Put(br)
}

// Writers recycles writers; the zero value is ready.
type Writers struct{ p sync.Pool }

// Get returns a writer to w.
func (wp *Writers) Get(w io.Writer) *bufio.Writer {
	if bw, ok := wp.p.Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, Size)
}

// Put hands bw back; it must not be used after.
func (wp *Writers) Put(bw *bufio.Writer) {
	bw.Reset(nil)
	wp.p.Put(bw)
}
