package leaseapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// TestAPIOnRedisAnswers503StoreUnavailableAndRecovers serves the lease API
// from a RedisStore on a real redis-server that is stopped and started.
func TestAPIOnRedisAnswers503StoreUnavailableAndRecovers(t *testing.T) {
	r := redis.Start(t, redis.Options{})
	s, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: r.URL(), Prefix: "apiredis"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	s.SetMembers([]pool.Member{{Name: "a", URL: &url.URL{Scheme: "http", Host: "127.0.0.1:3128"}}})
	srv := httptest.NewServer(leaseapi.NewAPIServer(s, leaseapi.APIOptions{}))
	defer srv.Close()
	post := func() (int, string) {
		resp, err := http.Post(srv.URL+"/v1/leases", "application/json", strings.NewReader(`{"target":"site.com"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(); code != http.StatusCreated {
		t.Fatalf("with redis up: %d %s", code, body)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	code, body := post()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"error":"store_unavailable"`) {
		t.Fatalf("with redis down: %d %s, want 503 store_unavailable", code, body)
	}
	resp, err := http.Get(srv.URL + "/v1/proxies")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("GET /v1/proxies with redis down: %d", resp.StatusCode)
	}
	// The client reads a 503 as the API being unreachable (transient).
	c, err := leaseapi.NewClient(srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), pool.AcquireRequest{}); !errors.Is(err, pool.ErrUnreachable) {
		t.Fatalf("client acquire with the store down: %v, want pool.ErrUnreachable", err)
	}
	r.Start()
	poll.Until(t, 15*time.Second, "an acquire after redis came back", func() error {
		if code, body := post(); code != http.StatusCreated {
			return fmt.Errorf("after redis returned: %d %s", code, body)
		}
		return nil
	})
}
