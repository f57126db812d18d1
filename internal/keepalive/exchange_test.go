package keepalive

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// startScripted answers every request it reads on a connection with
// answer ("" answers nothing and holds the connection; "close" closes it).
func startScripted(t *testing.T, answer string) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_ = req.Body.Close()
			switch answer {
			case "":
				_, _ = io.Copy(io.Discard, br)
				return
			case "close":
				return
			}
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	})
}

// TestRoundTripReadsOneAnswerAndKeepsOnlyACleanConnection pins the one
// exchange both lean clients use: interim answers skipped, a silent peer
// bounded by the answer timeout (not stale: it took the request), a peer
// that hung up stale (the request may go again), a 101 refused, and the
// connection pooled again only when its answer was read whole and did not
// close it. A head past MaxHead is HeadTooLarge, also when the bound cuts
// a line in its name (which the parser alone reads as a missing colon).
func TestRoundTripReadsOneAnswerAndKeepsOnlyACleanConnection(t *testing.T) {
	closedErr := errors.New("closed before answering")
	tooLarge := errors.New("head too large")
	// The status line (17 bytes) and the filler fill the 1 KiB bound but
	// for 2 bytes: the bound falls in the next line's name.
	cutInName := "HTTP/1.1 200 OK\r\nX-Fill: " + strings.Repeat("a", 1024-17-8-2-2) + "\r\nX-Name: v\r\nContent-Length: 0\r\n\r\n"
	tests := []struct {
		name   string
		answer string
		status int
		err    error
		stale  bool
		pooled bool
	}{
		{name: "an answer read whole keeps the connection", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", status: 200, pooled: true},
		{name: "interim answers are skipped", answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", status: 204, pooled: true},
		{name: "an answer that closes the connection is not pooled", answer: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", status: 200},
		{name: "a silent peer is an answer timeout, not stale", answer: "", err: ErrAnswerTimeout},
		{name: "a peer that hung up is stale", answer: "close", err: closedErr, stale: true},
		{name: "101 is refused", answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", err: ErrSwitched},
		{name: "a head past the bound is too large", answer: "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 2<<10) + "\r\n\r\n", err: tooLarge},
		{name: "a head cut by the bound in a name is too large", answer: cutInName, err: tooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPool(startScripted(t, tt.answer), Options{DialTimeout: 5 * time.Second})
			defer p.CloseIdle(true)
			pc, err := p.Dial(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodGet, "http://example.invalid/x", nil)
			a, stale, err := p.RoundTrip(t.Context(), pc, req, ExchangeOptions{Proxy: true, MaxHead: 1 << 10,
				HeadTooLarge: tooLarge, Closed: closedErr, AnswerTimeout: 200 * time.Millisecond, Deadline: time.Now().Add(30 * time.Second)})
			if !errors.Is(err, tt.err) || stale != tt.stale {
				t.Fatalf("RoundTrip: err %v stale %v, want err %v stale %v", err, stale, tt.err, tt.stale)
			}
			if err != nil {
				pc.Close()
				return
			}
			if a.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", a.StatusCode, tt.status)
			}
			_, _ = io.Copy(io.Discard, a.Body)
			a.Release(true)
			if pooled := p.Get() != nil; pooled != tt.pooled {
				t.Fatalf("pooled %v, want %v", pooled, tt.pooled)
			}
		})
	}
}
