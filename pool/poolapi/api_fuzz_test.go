package poolapi

import (
	"github.com/proxyfleet/proxyfleet/pool"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// FuzzLeaseAPIBodies feeds lease and report request bodies and list
// queries (outside input) to the real handler over a real store: nothing
// panics, nothing is a 5xx, and a refused request (4xx) changes no state —
// no lease appears, no cooldown starts.
func FuzzLeaseAPIBodies(f *testing.F) {
	f.Add(`{"selector":{"region":"eu"},"ttlSeconds":60,"target":"example.com"}`, `{"result":"banned","target":"example.com"}`, "attr.region=eu&healthy=true")
	f.Add(`{"ttlSeconds":-1}`, `{"result":"rate_limited","retryAfterSeconds":-5}`, "healthy=maybe")
	f.Add(`{"ttlSeconds":999999999999}`, `{"result":"nope"}`, "attr.=x")
	f.Add(`[1,2]`, `{"result":"target_unreachable","extra":1}`, "%zz")
	f.Fuzz(func(t *testing.T, leaseBody, reportBody, query string) {
		store := pool.NewStore(pool.StoreOptions{})
		u, _ := url.Parse("http://127.0.0.1:3128")
		store.SetMembers([]pool.Member{{Name: "a", URL: u, Attributes: map[string]string{"region": "eu"}}})
		h := NewAPIServer(store, APIOptions{})
		do := func(method, path, query, body string) int {
			req := httptest.NewRequest(method, "http://api.test"+path, strings.NewReader(body))
			req.URL.RawQuery = query // as a client sent it, unescaped
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body.String())
			}
			return rec.Code
		}
		if code := do(http.MethodPost, "/v1/leases", "", leaseBody); code != http.StatusCreated && store.ActiveLeases() != 0 {
			t.Fatalf("a refused acquire (%d) left %d leases", code, store.ActiveLeases())
		}
		// A report on a real lease: a refused one starts no cooldown.
		l, err := store.Acquire(t.Context(), pool.AcquireRequest{Target: "example.com"})
		if err != nil {
			t.Fatal(err)
		}
		before := store.ActiveCooldowns()
		if code := do(http.MethodPost, "/v1/leases/"+l.ID+"/report", "", reportBody); code >= 400 && store.ActiveCooldowns() != before {
			t.Fatalf("a refused report (%d) changed the cooldowns", code)
		}
		do(http.MethodGet, "/v1/proxies", query, "")
	})
}
