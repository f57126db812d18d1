package leaseapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestLeanExchangeServesHTTPBasesOnly pins which calls take the lean
// exchange: an http:// base of a client built without an HTTPClient (its
// pool then holds the connection after a call), never an https:// base or
// a caller's own client, which keep the Transport. The behaviour tests in
// lean_test.go would also pass over the Transport.
func TestLeanExchangeServesHTTPBasesOnly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()

	c, err := NewClient(srv.URL+","+tlsSrv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.lean[srv.URL] == nil {
		t.Fatal("no lean pool for the http:// base")
	}
	if c.lean[tlsSrv.URL] != nil {
		t.Fatal("a lean pool for the https:// base, which needs TLS")
	}
	if err := c.Release(context.Background(), "lease-1"); err != nil {
		t.Fatal(err)
	}
	if n := len(c.lean[srv.URL].Idle()); n != 1 {
		t.Fatalf("the lean pool holds %d idle connections after a call, want 1", n)
	}

	own, err := NewClient(srv.URL, "", &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	if own.lean != nil {
		t.Fatal("a caller's own HTTPClient got the lean exchange")
	}
}
