package testutil

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestRefusedAddrRefusesAndCannotBeTaken(t *testing.T) {
	addr := RefusedAddr(t)
	for range 3 {
		_, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", addr, err)
		}
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s", addr)
	}
}
