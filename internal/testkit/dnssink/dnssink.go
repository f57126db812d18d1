// Package dnssink runs a name server that answers nothing, for tests of
// what makes a real Squid resolve a name (a Squid's dns_nameservers points
// at it). It owns that server alone.
//
// It imports the standard library only: nothing of ours, so any test can
// start one without linking another launcher.
package dnssink

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Sink is a name server that reads every query and answers none. A
// Squid pointed at it (dns_nameservers) waits its whole dns_timeout on any
// lookup, and the sink records the names it was asked for, so a test can
// tell whether a request made Squid resolve anything, without a single
// packet leaving 127.0.0.0/8.
type Sink struct {
	conn *net.UDPConn

	mu    sync.Mutex
	asked map[string]int
}

// Start listens on UDP port 53 of a free 127.53.x.y address (Squid's
// dns_nameservers takes an address, never a port, and a low port needs root,
// as Squid's own tests do) until the test ends.
func Start(t testing.TB) *Sink {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		var b [2]byte
		_, _ = rand.Read(b[:])
		ip := net.IPv4(127, 53, b[0], b[1]|1)
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip, Port: 53})
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			t.Fatalf("DNS sink on %s:53: %v (binding port 53 needs root; run the tests as make test does)", ip, err)
		}
		s := &Sink{conn: conn, asked: map[string]int{}}
		done := make(chan struct{})
		go s.read(done)
		t.Cleanup(func() { _ = conn.Close(); <-done })
		return s
	}
	t.Fatal("DNS sink: no free 127.53.x.y:53 in 20 attempts")
	return nil
}

// IP is the address to name in dns_nameservers.
func (s *Sink) IP() string { return s.conn.LocalAddr().(*net.UDPAddr).IP.String() }

// Asked returns how many queries (of any type) named name, case-insensitively.
func (s *Sink) Asked(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[strings.ToLower(strings.TrimSuffix(name, "."))]
}

func (s *Sink) read(done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, 65535)
	for {
		n, _, err := s.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		name, err := queryName(buf[:n])
		if err != nil {
			continue
		}
		s.mu.Lock()
		s.asked[name]++
		s.mu.Unlock()
	}
}

// queryName is the QNAME of a DNS query's first question, lower-cased and
// without the root's dot (RFC 1035 4.1: a 12-byte header, then labels).
func queryName(msg []byte) (string, error) {
	if len(msg) < 12 || msg[4] == 0 && msg[5] == 0 {
		return "", errors.New("no question")
	}
	var labels []string
	for i := 12; ; {
		if i >= len(msg) {
			return "", errors.New("truncated name")
		}
		l := int(msg[i])
		if l == 0 {
			break
		}
		if l > 63 || i+1+l > len(msg) {
			return "", fmt.Errorf("bad label length %d", l)
		}
		labels = append(labels, string(msg[i+1:i+1+l]))
		i += 1 + l
	}
	return strings.ToLower(strings.Join(labels, ".")), nil
}
