package leaseapi

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
	"github.com/proxyfleet/proxyfleet/rotation"
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
			req := httptest.NewRequest(method, "http://127.0.0.1:8090"+path, strings.NewReader(body))
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

// FuzzPaceAPIBodies feeds POST /v1/pace bodies: never a 5xx, and a refused
// body changes no pace (no site slowed, no place taken, no slot reserved).
func FuzzPaceAPIBodies(f *testing.F) {
	f.Add(`{"op":"reserve","site":"example.com","member":"a","minIntervalMillis":2000,"auto":true,"maxWaitMillis":30000}`)
	f.Add(`{"op":"enter","site":"example.com","holder":"h","limit":1}`)
	f.Add(`{"op":"answer","site":"example.com","member":"a","result":"banned","seenCuts":-3}`)
	f.Add(`{"op":"return","site":"example.com","member":"a","token":-1}`)
	f.Add(`{"op":"reserve","site":"example.com","member":"a","minIntervalMillis":-5}`)
	f.Add(`{"op":"leave"}`)
	f.Add(`[{"op":"reserve"}]`)
	f.Add(`{"op":"answer","site":"example.com","member":"a","result":"banned","firstCut":{"intervalNanos":2000000000,"pauseNanos":11000000000,"floorNanos":2000000000,"steps":50,"memoryNanos":3600000000000}}`)
	f.Add(`{"op":"answer","site":"example.com","member":"a","result":"banned","firstCut":{"pauseNanos":-1}}`)
	f.Fuzz(func(t *testing.T, body string) {
		store := pool.NewStore(pool.StoreOptions{})
		h := NewAPIServer(store, APIOptions{})
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8090/v1/pace", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body.String())
		}
		if rec.Code < 400 {
			return
		}
		ctx := t.Context()
		if sites, _ := store.SlowedSites(ctx); len(sites) != 0 {
			t.Fatalf("a refused body (%d) slowed %v", rec.Code, sites)
		}
		if in, _ := store.EnterSite(ctx, "example.com", "probe", 1); !in {
			t.Fatalf("a refused body (%d) took a place", rec.Code)
		}
		if sl, _ := store.ReserveSlot(ctx, pool.SlotRequest{Site: "example.com", Member: "a", MinInterval: time.Hour}); sl.Wait != 0 {
			t.Fatalf("a refused body (%d) reserved a slot", rec.Code)
		}
	})
}

// FuzzQuotaAPIBodies: whatever POST /v1/quota is sent, the answer is not
// a 5xx, and a body refused as bad input (400) spends nothing of any
// client's quota.
func FuzzQuotaAPIBodies(f *testing.F) {
	f.Add(`{"op":"request","client":"team-a","site":"example.com","rps":2,"siteRps":1,"bytesPerDay":1000}`)
	f.Add(`{"op":"lease","client":"team-a","holder":"h","leases":1,"ttlMillis":60000}`)
	f.Add(`{"op":"return","client":"team-a","holder":"h"}`)
	f.Add(`{"op":"bytes","client":"team-a","bytes":500}`)
	f.Add(`{"op":"request","client":"Team_A","site":"example.com","rps":-1}`)
	f.Add(`{"op":"lease","client":"team-a","holder":"","leases":-1}`)
	f.Fuzz(func(t *testing.T, body string) {
		store := pool.NewStore(pool.StoreOptions{})
		h := NewAPIServer(store, APIOptions{})
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8090/v1/quota", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body.String())
		}
		if rec.Code != http.StatusBadRequest {
			return
		}
		ctx := t.Context()
		if err := store.TakeLease(ctx, "team-a", "probe", quota.Limits{Leases: 1}, time.Minute); err != nil {
			t.Fatalf("a refused body took a place: %v", err)
		}
		if err := store.TakeRequest(ctx, "team-a", "example.com", quota.Limits{RPS: 1}); err != nil {
			t.Fatalf("a refused body spent a request: %v", err)
		}
	})
}

// FuzzTierAPIBodies feeds POST /v1/tier bodies: never a 5xx, and a refused
// body changes no site's place.
func FuzzTierAPIBodies(f *testing.F) {
	rule := `"rule":{"threshold":1,"windowMillis":600000,"holdMillis":1800000,"probeEveryMillis":60000}`
	f.Add(`{"op":"start","site":"example.com","lo":0,"hi":2,"top":2,` + rule + `}`)
	f.Add(`{"op":"answer","site":"example.com","level":0,"seenMoves":0,"result":"banned","top":2,` + rule + `}`)
	f.Add(`{"op":"answer","site":"example.com","level":3,"result":"banned","top":2,` + rule + `}`)
	f.Add(`{"op":"start","site":"example.com","lo":2,"hi":1,"top":2,` + rule + `}`)
	f.Add(`{"op":"answer","site":"example.com","result":"banned","top":2,"rule":{"threshold":1,"windowMillis":-1}}`)
	f.Add(`{"op":"climb"}`)
	f.Add(`[{"op":"start"}]`)
	f.Fuzz(func(t *testing.T, body string) {
		store := pool.NewStore(pool.StoreOptions{})
		h := NewAPIServer(store, APIOptions{})
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8090/v1/tier", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body.String())
		}
		if rec.Code < 400 {
			return
		}
		st, _ := store.StartTier(t.Context(), "example.com", rotation.TierRange{Hi: 2}, rotation.DefaultTierRule)
		if st.Level != 0 || st.Moves != 0 || st.Probe {
			t.Fatalf("a refused body (%d) moved the site: %+v", rec.Code, st)
		}
	})
}
