package leases

import (
	"context"
	"net/http"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestAPIClosesAStalledBody: the controller's lease API cuts off a client
// that announced a body and stopped sending it once its read timeout
// (shrunk here) passes. With a header timeout only, the connection was
// held for as long as the client liked.
func TestAPIClosesAStalledBody(t *testing.T) {
	fake := &informertest.FakeInformers{}
	a, err := New(Options{Listen: "127.0.0.1:0", Cache: fake, Credentials: fake,
		HTTPTimeouts: httpserver.Timeouts{Read: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	close(a.source.synced) // no manager: the API serves an empty pool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	c := testutil.StallBody(t, a.Addr().String(), http.MethodPost, "/v1/leases", "Content-Type: application/json")
	if _, err := c.Closed(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}
