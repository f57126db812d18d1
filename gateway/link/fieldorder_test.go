package link

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/fieldorder"
)

// recordConn is a net.Conn that keeps what is written to it.
type recordConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordConn) Write(p []byte) (int, error) { return c.buf.Write(p) }

func TestOrderConnRewritesTheArmedHeadOnly(t *testing.T) {
	order := fieldorder.Parse([]byte("GET / HTTP/1.1\r\nHost: h\r\nzed: 1\r\naccept: */*\r\n\r\n"))
	goHead := "POST / HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nContent-Length: 3\r\nZed: 1\r\n\r\n"
	tests := []struct {
		name   string
		armed  bool
		writes []string
		want   string
	}{
		{"unarmed, bytes pass as they are", false, []string{goHead, "abc"}, goHead + "abc"},
		{"armed, the head in one write with its body", true, []string{goHead + "abc"},
			"POST / HTTP/1.1\r\nHost: h\r\nzed: 1\r\naccept: */*\r\nContent-Length: 3\r\n\r\nabc"},
		{"armed, the head cut across writes, the end line too", true, []string{goHead[:10], goHead[10 : len(goHead)-2], goHead[len(goHead)-2:], "abc"},
			"POST / HTTP/1.1\r\nHost: h\r\nzed: 1\r\naccept: */*\r\nContent-Length: 3\r\n\r\nabc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := &recordConn{}
			oc := &orderConn{Conn: rc}
			if tc.armed {
				oc.arm(order, false)
			}
			for _, w := range tc.writes {
				if n, err := oc.Write([]byte(w)); err != nil || n != len(w) {
					t.Fatalf("Write: %d, %v", n, err)
				}
			}
			if got := rc.buf.String(); got != tc.want {
				t.Fatalf("wrote\n%q\nwant\n%q", got, tc.want)
			}
			// The next request, not armed, goes as it is.
			rc.buf.Reset()
			if _, err := oc.Write([]byte(goHead)); err != nil || rc.buf.String() != goHead {
				t.Fatalf("the next head was rewritten: %q, %v", rc.buf.String(), err)
			}
		})
	}
}

// TestOrderConnRefusesAnEndlessHead: an armed head that never ends is cut
// off with an error, not held without bound or sent half.
func TestOrderConnRefusesAnEndlessHead(t *testing.T) {
	rc := &recordConn{}
	oc := &orderConn{Conn: rc}
	oc.arm(fieldorder.Parse([]byte("GET / HTTP/1.1\r\nA: 1\r\n\r\n")), false)
	chunk := []byte("X-Long: " + strings.Repeat("v", 64<<10) + "\r\n")
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := oc.Write(chunk)
		if errors.Is(err, errOrderedHeadTooLarge) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("no bound on the head: %v", err)
		}
	}
	if rc.buf.Len() != 0 {
		t.Fatalf("%d bytes of the head were sent", rc.buf.Len())
	}
}
