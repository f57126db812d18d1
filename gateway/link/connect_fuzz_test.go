package link

import (
	"bufio"
	"strings"
	"testing"
)

// FuzzReadConnectAnswer feeds an upstream's answer to CONNECT (outside
// input): it never panics, a status is always a three-digit HTTP status,
// and an error is never also a status.
func FuzzReadConnectAnswer(f *testing.F) {
	f.Add("HTTP/1.1 200 Connection established\r\n\r\n")
	f.Add("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_DNS_FAIL 0\r\n\r\n")
	f.Add("HTTP/1.0 407 Proxy Authentication Required\r\nProxy-Status: gw; error=dns_error\r\n\r\n")
	f.Add("HTTP/1.1 2x0 OK\r\n\r\n")
	f.Add("SSH-2.0-OpenSSH\r\n")
	f.Fuzz(func(t *testing.T, in string) {
		status, line, ue, err := ReadConnectAnswer(bufio.NewReaderSize(strings.NewReader(in), 4096))
		if err != nil {
			if status != 0 {
				t.Fatalf("status %d with error %v", status, err)
			}
			return
		}
		if status < 200 || status > 999 {
			t.Fatalf("status %d accepted from %q", status, in)
		}
		if strings.ContainsAny(line, "\r\n") || strings.ContainsAny(ue.Reason(), "\r\n") {
			t.Fatalf("control characters reach a message: %q %q", line, ue.Reason())
		}
	})
}
