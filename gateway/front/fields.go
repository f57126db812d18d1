package front

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/proxyfleet/proxyfleet/internal/httphead"
)

// InvalidFieldName returns the first name in h that is not a token.
// net/http's parser accepts a space inside or before the colon
// ("Transfer-Encoding : chunked") and keeps such a name as it is, which an
// upstream may read as a framing header the gateway never saw.
func InvalidFieldName(h http.Header) (string, bool) {
	for k := range h {
		if !httphead.ValidFieldName(k) {
			return k, false
		}
	}
	return "", true
}

// HasToken reports whether a comma-separated header (Connection) lists
// token (a header name, or an option such as close), case-insensitively.
func HasToken(values []string, token string) bool {
	for _, v := range values {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
}

// guardBody is a request body the Server hands its handler: a Read holds
// its lock, and abandon (after the connection is closed, which ends a Read
// under way) waits for it and fails every later Read. A Transport may still
// be copying the body from another goroutine when the handler returns; the
// guard keeps it off the connection's buffers once they are reused.
type guardBody struct {
	mu     sync.Mutex
	rc     io.ReadCloser
	closed bool
}

func (b *guardBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errAbandoned
	}
	return b.rc.Read(p)
}

func (b *guardBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	return b.rc.Close()
}

func (b *guardBody) abandon() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// errAbandoned is what a read after the request ended returns.
var errAbandoned = errors.New("request body read after its request ended")
