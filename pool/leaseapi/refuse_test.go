package leaseapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// TestAPIRefusesWithoutWaitingForAnUnreadBody: a request the API refuses
// before reading its body (no token, a wrong method or path, a body
// announced above the limit) is answered at once and its connection
// closed, although the client sent one byte of the body it announced and
// nothing more. The server here has no read timeout, so without the
// early close the refusal would wait for a body that never comes.
func TestAPIRefusesWithoutWaitingForAnUnreadBody(t *testing.T) {
	srv := httptest.NewServer(leaseapi.NewAPIServer(pool.NewStore(pool.StoreOptions{}), leaseapi.APIOptions{Token: "s3cret"}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	const auth, ctJSON = "Authorization: Bearer s3cret", "Content-Type: application/json"
	for _, tc := range []struct {
		name, method, path string
		hdr                []string
		status             int
		code               string
	}{
		{"no token is a 401", http.MethodPost, "/v1/leases", []string{ctJSON}, http.StatusUnauthorized, "unauthorized"},
		{"a wrong token is a 401", http.MethodPost, "/v1/pace", []string{ctJSON, "Authorization: Bearer nope"}, http.StatusUnauthorized, "unauthorized"},
		{"a wrong method is a 405", http.MethodPut, "/v1/leases", []string{ctJSON, auth}, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"a wrong path is a 404", http.MethodPost, "/v1/nothing", []string{ctJSON, auth}, http.StatusNotFound, "not_found"},
		{"a body announced above the limit is a 413", http.MethodPost, "/v1/leases", []string{ctJSON, auth, "Content-Length: 100000"}, http.StatusRequestEntityTooLarge, "body_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testutil.StallBody(t, addr, tc.method, tc.path, tc.hdr...)
			resp, body, err := c.Answer(10 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var e struct{ Error, Message string }
			_ = json.Unmarshal(body, &e)
			if resp.StatusCode != tc.status || e.Error != tc.code || !resp.Close {
				t.Fatalf("%d %s (%s), Connection: close %v; want %d %s and close", resp.StatusCode, e.Error, e.Message, resp.Close, tc.status, tc.code)
			}
			if _, err := c.Closed(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAPIRefusalReachesAClientStillSendingItsBody: closing a refused
// connection must not reset it under a client that is still sending the
// body it announced, or the client sees a broken pipe instead of its 401
// or 413. Each case is tried 200 times: a reset is a race.
func TestAPIRefusalReachesAClientStillSendingItsBody(t *testing.T) {
	srv := httptest.NewServer(leaseapi.NewAPIServer(pool.NewStore(pool.StoreOptions{}), leaseapi.APIOptions{Token: "s3cret"}))
	defer srv.Close()
	body := func(n int) string { return `{"selector":{"pad":"` + strings.Repeat("x", n) + `"}}` }
	for _, tc := range []struct {
		name, token, body string
		status            int
	}{
		{"a body above the limit is a 413", "s3cret", body(70 << 10), http.StatusRequestEntityTooLarge},
		{"a large body without a token is a 401", "", body(60 << 10), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 200 {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/leases", strings.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
				if tc.token != "" {
					req.Header.Set("Authorization", "Bearer "+tc.token)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatalf("try %d: %v, want a %d", i, err, tc.status)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != tc.status {
					t.Fatalf("try %d: %d, want %d", i, resp.StatusCode, tc.status)
				}
			}
		})
	}
}
