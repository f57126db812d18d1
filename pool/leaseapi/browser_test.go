package leaseapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// TestAPIRefusesWhatAWebPageCouldSend: a page in the browser of the
// API's user must not use it. Its POST with a text/plain or form body
// needs no CORS preflight (a 415 now), a browser marks its requests with
// Origin or Sec-Fetch-Site (a 403), and a DNS rebinding page addresses
// an open API by its own name (a 403 unless the Host is localhost or an
// IP address). What programs send still works. Refused requests change
// nothing.
func TestAPIRefusesWhatAWebPageCouldSend(t *testing.T) {
	open := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	withToken := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: "s3cret"}, testMembers(t))
	const lease, pace = `{"target":"example.com"}`, `{"op":"answer","site":"example.com","member":"squid-eu-1","result":"banned"}`
	for _, tc := range []struct {
		name               string
		f                  *apiFixture
		method, path, body string
		hdr                map[string]string // "Host" sets the request's Host
		status             int
		code               string
	}{
		{"a text/plain pace answer is a 415", open, "POST", "/v1/pace", pace, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"a form-encoded lease is a 415", open, "POST", "/v1/leases", lease, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"a body without Content-Type is a 415", open, "POST", "/v1/leases", lease, map[string]string{"Content-Type": ""}, 415, "unsupported_media_type"},
		{"a 415 also with a token", withToken, "POST", "/v1/pace", pace, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"JSON with a charset is a lease", open, "POST", "/v1/leases", lease, map[string]string{"Content-Type": "application/json; charset=utf-8"}, 201, ""},
		{"an empty lease body needs no Content-Type", open, "POST", "/v1/leases", "", nil, 201, ""},
		{"a request with Origin is a 403", open, "POST", "/v1/leases", lease, map[string]string{"Origin": "https://evil.example"}, 403, "browser_request"},
		{"a request with Origin is a 403 also with a token", withToken, "GET", "/v1/proxies?credentials=true", "", map[string]string{"Origin": "null"}, 403, "browser_request"},
		{"a cross-site fetch is a 403", open, "GET", "/v1/proxies", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "browser_request"},
		{"a same-site fetch (another localhost port) is a 403", open, "GET", "/v1/proxies", "", map[string]string{"Sec-Fetch-Site": "same-site"}, 403, "browser_request"},
		{"a rebound name as Host is a 403 without a token", open, "GET", "/v1/proxies", "", map[string]string{"Host": "rebind.evil.example:8090"}, 403, "host_not_allowed"},
		{"a rebound name cannot take a lease either", open, "POST", "/v1/leases", lease, map[string]string{"Host": "rebind.evil.example"}, 403, "host_not_allowed"},
		{"localhost is a Host", open, "GET", "/v1/proxies", "", map[string]string{"Host": "localhost:8090"}, 200, ""},
		{"an IPv6 loopback is a Host", open, "GET", "/v1/proxies", "", map[string]string{"Host": "[::1]:8090"}, 200, ""},
		{"any IP address is a Host (an open API reached by its address)", open, "GET", "/v1/proxies", "", map[string]string{"Host": "10.1.2.3:8090"}, 200, ""},
		{"with a token any Host is", withToken, "GET", "/v1/proxies", "", map[string]string{"Host": "proxyfleet.proxyfleet-system.svc:8090"}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader
			if tc.body != "" {
				rd = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, tc.f.srv.URL+tc.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			if tc.f.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.f.token)
			}
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, v := range tc.hdr {
				switch {
				case k == "Host":
					req.Host = v
				case v == "":
					req.Header.Del(k)
				default:
					req.Header.Set(k, v)
				}
			}
			before := tc.f.store.ActiveLeases()
			resp, err := tc.f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			a := apiAnswer{status: resp.StatusCode, header: resp.Header, body: b}
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d %s", a.status, b, tc.status, tc.code)
			}
			if tc.code == "" {
				return
			}
			if got := a.errorCode(t); got != tc.code {
				t.Fatalf("error %q, want %q", got, tc.code)
			}
			if after := tc.f.store.ActiveLeases(); after != before {
				t.Fatalf("a refused request took a lease (%d, then %d)", before, after)
			}
			if sites, _ := tc.f.store.SlowedSites(t.Context()); len(sites) != 0 {
				t.Fatalf("a refused request slowed %v", sites)
			}
		})
	}
}
