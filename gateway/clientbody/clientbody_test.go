package clientbody

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// broken is a client body that gives its bytes, then err.
type broken struct {
	r   io.Reader
	err error
}

func (b *broken) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, b.err
	}
	return n, err
}

func (b *broken) Close() error { return nil }

func TestReadAheadJudgesTheBodyBeforeAnythingIsSent(t *testing.T) {
	tests := []struct {
		name     string
		body     io.ReadCloser
		trailer  http.Header
		limit    int
		whole    bool
		length   int64
		reason   string // the fault's Reason, "" for none
		outcome  string // the fault's Outcome
		forwards string // what Read hands on, read to its end (no fault)
	}{
		{name: "a body within the limit is whole with its length",
			body: io.NopCloser(strings.NewReader("form=1")), limit: 64, whole: true, length: 6, forwards: "form=1"},
		{name: "a body past the limit streams on from where it stopped",
			body: io.NopCloser(strings.NewReader(strings.Repeat("x", 100))), limit: 10, forwards: strings.Repeat("x", 100)},
		{name: "an empty body is whole",
			body: io.NopCloser(strings.NewReader("")), limit: 64, whole: true, length: 0},
		{name: "a body with trailers is not whole: only chunks carry them",
			body: io.NopCloser(strings.NewReader("abc")), trailer: http.Header{"X-Sum": {"1"}}, limit: 64, forwards: "abc"},
		{name: "a body cut before its announced end is the client's 400",
			body: &broken{strings.NewReader("ab"), io.ErrUnexpectedEOF}, limit: 64,
			reason: fault.ReasonBadRequest, outcome: fault.OutcomeClientGone},
		{name: "a client that stops sending is the client's timeout",
			body: &broken{strings.NewReader("ab"), os.ErrDeadlineExceeded}, limit: 64,
			reason: fault.ReasonClientTimeout, outcome: fault.ReasonClientTimeout},
		{name: "a malformed body is the client's 400",
			body: &broken{strings.NewReader("ab"), errors.New("invalid chunk length")}, limit: 64,
			reason: fault.ReasonBadRequest, outcome: fault.ReasonBadRequest},
		{name: "a malformed trailer name at the body's end is the client's 400",
			body: io.NopCloser(strings.NewReader("abc")), trailer: http.Header{"Bad Name": {"1"}}, limit: 64,
			reason: fault.ReasonBadRequest, outcome: fault.ReasonBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &http.Request{Trailer: tt.trailer}
			b := New(req, tt.body)
			cf := b.ReadAhead(tt.limit)
			if tt.reason != "" || tt.outcome != "" {
				if cf == nil || cf.Reason != tt.reason || cf.Outcome != tt.outcome {
					t.Fatalf("fault %+v; want reason %q outcome %q", cf, tt.reason, tt.outcome)
				}
				if got := b.Fault(); got != cf {
					t.Fatalf("Fault() = %v after ReadAhead's %v", got, cf)
				}
				if _, err := io.ReadAll(b); !errors.As(err, new(*fault.Client)) {
					t.Fatalf("reading on after the fault: %v; want the client's fault again", err)
				}
				return
			}
			if cf != nil {
				t.Fatalf("unexpected fault %v", cf)
			}
			n, whole := b.Whole()
			if whole != tt.whole || n != tt.length {
				t.Fatalf("Whole() = %d, %v; want %d, %v", n, whole, tt.length, tt.whole)
			}
			got, err := io.ReadAll(b)
			if err != nil || string(got) != tt.forwards {
				t.Fatalf("forwarded %q, %v; want %q", got, err, tt.forwards)
			}
			if b.BytesRead() != int64(len(tt.forwards)) {
				t.Fatalf("BytesRead() = %d, want %d", b.BytesRead(), len(tt.forwards))
			}
		})
	}
}

// TestStalledIsTrueOnlyWhileTheForwardingWaitsOnTheClient: a deadline that
// passes while a Read waits on the client is the client's; once the body
// ended, or with no body, it is not.
func TestStalledIsTrueOnlyWhileTheForwardingWaitsOnTheClient(t *testing.T) {
	var none *Body
	if none.Stalled() || none.Fault() != nil {
		t.Fatal("no body is neither stalled nor at fault")
	}
	pr, pw := io.Pipe()
	b := New(&http.Request{}, pr)
	if b.Stalled() {
		t.Fatal("stalled before anything read")
	}
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(b)
		read <- err
	}()
	poll.Until(t, 10*time.Second, "a Read waiting on the client to count as stalled", func() error {
		if !b.Stalled() {
			return errors.New("not stalled")
		}
		return nil
	})
	_, _ = pw.Write([]byte("late"))
	_ = pw.Close()
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if b.Stalled() {
		t.Fatal("stalled after the body ended")
	}
}
