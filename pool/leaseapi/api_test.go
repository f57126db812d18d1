package leaseapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	clocktesting "k8s.io/utils/clock/testing"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// newTestClock is a settable clock for the store; the API server itself reads no clock.
func newTestClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
}

// apiFixture is a real Store behind a real APIServer on a loopback port.
type apiFixture struct {
	store *pool.Store
	clock *clocktesting.FakeClock
	srv   *httptest.Server
	token string
}

func testMembers(t testing.TB) []pool.Member {
	t.Helper()
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("parse %q: %v", s, err)
		}
		return u
	}
	return []pool.Member{
		{Name: "a", URL: mustURL("http://user:secret-a@127.0.0.1:3128"), Attributes: map[string]string{"region": "eu", "tier": "dc"}},
		{Name: "b", URL: mustURL("http://user:secret-b@127.0.0.2:3128"), Attributes: map[string]string{"region": "eu", "tier": "res"}},
		{Name: "c", URL: mustURL("socks5://127.0.0.3:1080"), Attributes: map[string]string{"region": "us", "tier": "dc"}},
	}
}

// newAPIFixture starts the server; configure runs before it starts listening.
func newAPIFixture(t testing.TB, so pool.StoreOptions, ao leaseapi.APIOptions, members []pool.Member, configure ...func(*httptest.Server)) *apiFixture {
	t.Helper()
	f := &apiFixture{clock: newTestClock(), token: ao.Token}
	if so.Clock == nil {
		so.Clock = f.clock
	}
	f.store = pool.NewStore(so)
	f.store.SetMembers(members)
	if ao.Logger == nil {
		ao.Logger = slog.New(slog.DiscardHandler)
	}
	f.srv = httptest.NewUnstartedServer(leaseapi.NewAPIServer(f.store, ao))
	for _, c := range configure {
		c(f.srv)
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

type apiAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a apiAnswer) errorCode(t testing.TB) string {
	t.Helper()
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, a.body)
	}
	if e.Message == "" {
		t.Errorf("error body %s has no message", a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q, want application/json", ct)
	}
	return e.Error
}

// call sends one request with the fixture's token (if any) unless hdr overrides Authorization.
func (f *apiFixture) call(t testing.TB, method, path, body string, hdr ...string) apiAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return apiAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

type wireList struct {
	Proxies []leaseapi.ProxyInfo `json:"proxies"`
	Count   int                  `json:"count"`
}

func (f *apiFixture) list(t testing.TB, query string) wireList {
	t.Helper()
	a := f.call(t, http.MethodGet, "/v1/proxies"+query, "")
	if a.status != http.StatusOK {
		t.Fatalf("GET /v1/proxies%s = %d %s", query, a.status, a.body)
	}
	var l wireList
	if err := json.Unmarshal(a.body, &l); err != nil {
		t.Fatalf("list body: %v: %s", err, a.body)
	}
	if l.Count != len(l.Proxies) {
		t.Errorf("count %d != %d proxies", l.Count, len(l.Proxies))
	}
	return l
}

func (f *apiFixture) acquire(t testing.TB, body string) leaseapi.LeaseInfo {
	t.Helper()
	a := f.call(t, http.MethodPost, "/v1/leases", body)
	if a.status != http.StatusCreated {
		t.Fatalf("POST /v1/leases %s = %d %s", body, a.status, a.body)
	}
	var l leaseapi.LeaseInfo
	if err := json.Unmarshal(a.body, &l); err != nil {
		t.Fatalf("lease body: %v: %s", err, a.body)
	}
	return l
}

func names(l wireList) string {
	var n []string
	for _, p := range l.Proxies {
		n = append(n, p.Name)
	}
	return strings.Join(n, ",")
}

func find(t testing.TB, l wireList, name string) leaseapi.ProxyInfo {
	t.Helper()
	for _, p := range l.Proxies {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("member %q not in list %s", name, names(l))
	return leaseapi.ProxyInfo{}
}

func TestAPIListFiltersByAttributesAndHealth(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	f.store.SetHealth("b", false, 0)
	f.store.SetHealth("a", true, 42*time.Millisecond)

	for _, tc := range []struct {
		name, query, want string
	}{
		{"no filter lists every member sorted by name", "", "a,b,c"},
		{"one attribute", "?attr.region=eu", "a,b"},
		{"two attributes are ANDed", "?attr.region=eu&attr.tier=dc", "a"},
		{"healthy=true drops unhealthy members", "?healthy=true", "a,c"},
		{"healthy=false lists only unhealthy members", "?healthy=false", "b"},
		{"attribute and health combine", "?attr.region=eu&healthy=true", "a"},
		{"nothing matching is an empty 200", "?attr.region=mars", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(f.list(t, tc.query)); got != tc.want {
				t.Errorf("GET /v1/proxies%s = [%s], want [%s]", tc.query, got, tc.want)
			}
		})
	}

	t.Run("empty list is a JSON array, not null", func(t *testing.T) {
		a := f.call(t, http.MethodGet, "/v1/proxies?attr.region=mars", "")
		if !bytes.Contains(a.body, []byte(`"proxies":[]`)) || !bytes.Contains(a.body, []byte(`"count":0`)) {
			t.Errorf("body = %s", a.body)
		}
	})

	t.Run("entries carry redacted URL, attributes, health, latency", func(t *testing.T) {
		l := f.list(t, "")
		a := find(t, l, "a")
		if strings.Contains(a.URL, "secret-a") || !strings.Contains(a.URL, "127.0.0.1:3128") {
			t.Errorf("url = %q, want the address without the password", a.URL)
		}
		if a.Attributes["region"] != "eu" || a.Attributes["tier"] != "dc" {
			t.Errorf("attributes = %v", a.Attributes)
		}
		if !a.Healthy || a.LatencyMillis != 42 {
			t.Errorf("healthy=%v latencyMillis=%d, want true 42", a.Healthy, a.LatencyMillis)
		}
		if b := find(t, l, "b"); b.Healthy {
			t.Error("b listed healthy after SetHealth(false)")
		}
		if c := find(t, l, "c"); c.URL != "socks5://127.0.0.3:1080" {
			t.Errorf("c url = %q", c.URL)
		}
		if raw := f.call(t, http.MethodGet, "/v1/proxies", ""); bytes.Contains(raw.body, []byte("secret")) {
			t.Errorf("list leaks a password: %s", raw.body)
		}
	})

	t.Run("active leases are counted", func(t *testing.T) {
		f.acquire(t, `{"proxy":"c"}`)
		f.acquire(t, `{"proxy":"c"}`)
		if c := find(t, f.list(t, ""), "c"); c.ActiveLeases != 2 {
			t.Errorf("c activeLeases = %d, want 2", c.ActiveLeases)
		}
	})

	for _, tc := range []struct{ name, query string }{
		{"unknown parameter", "?region=eu"},
		{"healthy not a boolean", "?healthy=maybe"},
		{"attribute without a name", "?attr.=eu"},
		{"parameter given twice", "?attr.region=eu&attr.region=us"},
	} {
		t.Run("400 for "+tc.name, func(t *testing.T) {
			a := f.call(t, http.MethodGet, "/v1/proxies"+tc.query, "")
			if a.status != http.StatusBadRequest || a.errorCode(t) != "bad_request" {
				t.Errorf("status %d body %s, want 400 bad_request", a.status, a.body)
			}
		})
	}
}

func TestAPIAcquireAnswers201WithTheLease(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{DefaultTTL: 60 * time.Second, MaxTTL: time.Hour}, leaseapi.APIOptions{}, testMembers(t))
	now := f.clock.Now()

	t.Run("defaults: first member by name, default TTL, credentials in the URL", func(t *testing.T) {
		a := f.call(t, http.MethodPost, "/v1/leases", `{"selector":{"region":"eu"},"target":"Example.COM:443"}`)
		if a.status != http.StatusCreated {
			t.Fatalf("status %d %s", a.status, a.body)
		}
		if a.header.Get("Content-Type") != "application/json" || a.header.Get("Cache-Control") != "no-store" {
			t.Errorf("headers = %v", a.header)
		}
		var raw map[string]any
		if err := json.Unmarshal(a.body, &raw); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"leaseID", "proxy", "target", "expiresAt", "ttlSeconds"} {
			if _, ok := raw[k]; !ok {
				t.Errorf("201 body lacks %q: %s", k, a.body)
			}
		}
		var l leaseapi.LeaseInfo
		if err := json.Unmarshal(a.body, &l); err != nil {
			t.Fatal(err)
		}
		if l.LeaseID == "" || l.Proxy.Name != "a" {
			t.Errorf("leaseID %q proxy %q, want an ID and a", l.LeaseID, l.Proxy.Name)
		}
		if l.Proxy.URL != "http://user:secret-a@127.0.0.1:3128" {
			t.Errorf("proxy.url = %q, want it with credentials", l.Proxy.URL)
		}
		if l.Proxy.Attributes["region"] != "eu" {
			t.Errorf("proxy.attributes = %v", l.Proxy.Attributes)
		}
		if l.Target != "example.com" {
			t.Errorf("target = %q, want the normalised example.com", l.Target)
		}
		if l.TTLSeconds != 60 || !l.ExpiresAt.Equal(now.Add(60*time.Second)) {
			t.Errorf("ttlSeconds %d expiresAt %s, want 60 and %s", l.TTLSeconds, l.ExpiresAt, now.Add(60*time.Second))
		}
		if _, err := time.Parse(time.RFC3339, raw["expiresAt"].(string)); err != nil {
			t.Errorf("expiresAt %v is not RFC 3339: %v", raw["expiresAt"], err)
		}
	})

	t.Run("explicit TTL, pin by name, empty body", func(t *testing.T) {
		l := f.acquire(t, `{"ttlSeconds":3600,"proxy":"c"}`)
		if l.TTLSeconds != 3600 || l.Proxy.Name != "c" || l.Target != "" {
			t.Errorf("lease = %+v", l)
		}
		if l := f.acquire(t, ""); l.Proxy.Name != "b" {
			t.Errorf("empty body leased %q, want b (a and c have a lease each)", l.Proxy.Name)
		}
	})
}

func TestAPIAcquire409CountsWhyNothingIsUsable(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{MaxLeasesPerMember: 1}, leaseapi.APIOptions{}, testMembers(t))
	// a: unhealthy; b: cooled down for example.com; c: at capacity.
	f.store.SetHealth("a", false, 0)
	lb := f.acquire(t, `{"proxy":"b","target":"example.com"}`)
	if a := f.call(t, http.MethodPost, "/v1/leases/"+lb.LeaseID+"/report", `{"result":"banned"}`); a.status != http.StatusNoContent {
		t.Fatalf("report = %d %s", a.status, a.body)
	}
	if a := f.call(t, http.MethodDelete, "/v1/leases/"+lb.LeaseID, ""); a.status != http.StatusNoContent {
		t.Fatalf("release = %d", a.status)
	}
	f.acquire(t, `{"proxy":"c"}`)

	type counts struct {
		Error      string `json:"error"`
		Message    string `json:"message"`
		Considered int    `json:"considered"`
		AtCapacity int    `json:"atCapacity"`
		InCooldown int    `json:"inCooldown"`
		Unhealthy  int    `json:"unhealthy"`
	}
	for _, tc := range []struct {
		name, body string
		want       counts
	}{
		{"every reason at once", `{"target":"example.com"}`, counts{Considered: 3, AtCapacity: 1, InCooldown: 1, Unhealthy: 1}},
		{"selector narrows what is considered", `{"selector":{"tier":"dc"},"target":"example.com"}`, counts{Considered: 2, AtCapacity: 1, Unhealthy: 1}},
		{"selector matching nothing", `{"selector":{"region":"mars"}}`, counts{}},
		{"pinned to an unknown name", `{"proxy":"nope"}`, counts{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := f.call(t, http.MethodPost, "/v1/leases", tc.body)
			if a.status != http.StatusConflict {
				t.Fatalf("status %d %s, want 409", a.status, a.body)
			}
			var got counts
			if err := json.Unmarshal(a.body, &got); err != nil {
				t.Fatal(err)
			}
			if got.Error != "no_match" || got.Message == "" {
				t.Errorf("error %q message %q", got.Error, got.Message)
			}
			got.Error, got.Message = "", ""
			if got != tc.want {
				t.Errorf("counts = %+v, want %+v", got, tc.want)
			}
		})
	}

	t.Run("every member considered resting: when the first is back", func(t *testing.T) {
		a := f.call(t, http.MethodPost, "/v1/leases", `{"proxy":"b","target":"example.com"}`)
		var got struct {
			RetryAfterSeconds int64 `json:"retryAfterSeconds"`
		}
		if err := json.Unmarshal(a.body, &got); err != nil || a.status != http.StatusConflict {
			t.Fatalf("%d %s %v", a.status, a.body, err)
		}
		if got.RetryAfterSeconds < 590 || got.RetryAfterSeconds > 600 || a.header.Get("Retry-After") != strconv.FormatInt(got.RetryAfterSeconds, 10) {
			t.Errorf("retryAfterSeconds %d, Retry-After %q: want the 10m ban's end, in both", got.RetryAfterSeconds, a.header.Get("Retry-After"))
		}
		// With a (unhealthy) and c (at capacity) considered it is unknown.
		if a := f.call(t, http.MethodPost, "/v1/leases", `{"target":"example.com"}`); strings.Contains(string(a.body), "retryAfterSeconds") || a.header.Get("Retry-After") != "" {
			t.Errorf("a refusal with an unhealthy member says when: %s %v", a.body, a.header)
		}
	})

	t.Run("another target is not blocked by b's cooldown", func(t *testing.T) {
		if l := f.acquire(t, `{"target":"example.org"}`); l.Proxy.Name != "b" {
			t.Errorf("leased %q, want b", l.Proxy.Name)
		}
	})
}

func TestAPIReleaseIsIdempotent(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	l := f.acquire(t, `{"proxy":"a"}`)
	if got := find(t, f.list(t, ""), "a").ActiveLeases; got != 1 {
		t.Fatalf("activeLeases = %d after acquire", got)
	}
	for _, tc := range []struct{ name, id string }{
		{"first release", l.LeaseID},
		{"second release of the same lease", l.LeaseID},
		{"unknown lease", "never-issued"},
	} {
		t.Run(tc.name+" is 204", func(t *testing.T) {
			a := f.call(t, http.MethodDelete, "/v1/leases/"+tc.id, "")
			if a.status != http.StatusNoContent || len(a.body) != 0 {
				t.Errorf("status %d body %q, want 204 and no body", a.status, a.body)
			}
		})
	}
	if got := find(t, f.list(t, ""), "a").ActiveLeases; got != 0 {
		t.Errorf("activeLeases = %d after release, want 0", got)
	}
}

func TestAPIReportCoolsDownOnlyThatTarget(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: 10 * time.Minute, Max: time.Hour}},
		leaseapi.APIOptions{}, testMembers(t))
	now := f.clock.Now()
	l := f.acquire(t, `{"proxy":"a","target":"example.com"}`)

	a := f.call(t, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"rate_limited","target":"Example.com:443","retryAfterSeconds":30}`)
	if a.status != http.StatusNoContent {
		t.Fatalf("report = %d %s", a.status, a.body)
	}

	t.Run("the cooldown shows in the list with its end", func(t *testing.T) {
		cds := find(t, f.list(t, ""), "a").Cooldowns
		if len(cds) != 1 || cds[0].Target != "example.com" || !cds[0].Until.Equal(now.Add(30*time.Second)) {
			t.Errorf("cooldowns = %+v, want example.com until %s", cds, now.Add(30*time.Second))
		}
	})
	t.Run("an acquire for that target avoids the member", func(t *testing.T) {
		a := f.call(t, http.MethodPost, "/v1/leases", `{"proxy":"a","target":"example.com"}`)
		if a.status != http.StatusConflict || !bytes.Contains(a.body, []byte(`"inCooldown":1`)) {
			t.Errorf("status %d %s, want 409 with inCooldown 1", a.status, a.body)
		}
		if l := f.acquire(t, `{"selector":{"tier":"dc"},"target":"example.com"}`); l.Proxy.Name != "c" {
			t.Errorf("leased %q for the cooled target, want c", l.Proxy.Name)
		}
	})
	t.Run("other targets still get the member", func(t *testing.T) {
		if l := f.acquire(t, `{"proxy":"a","target":"example.org"}`); l.Proxy.Name != "a" {
			t.Errorf("leased %q, want a", l.Proxy.Name)
		}
	})
	t.Run("the member is usable again after the window", func(t *testing.T) {
		f.clock.Step(31 * time.Second)
		if l := f.acquire(t, `{"proxy":"a","target":"example.com"}`); l.Proxy.Name != "a" {
			t.Errorf("leased %q, want a", l.Proxy.Name)
		}
	})
	t.Run("a report without target falls back to the lease's target", func(t *testing.T) {
		l := f.acquire(t, `{"proxy":"b","target":"example.net"}`)
		if a := f.call(t, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"banned"}`); a.status != http.StatusNoContent {
			t.Fatalf("report = %d %s", a.status, a.body)
		}
		cds := find(t, f.list(t, ""), "b").Cooldowns
		if len(cds) != 1 || cds[0].Target != "example.net" {
			t.Errorf("cooldowns = %+v, want only example.net", cds)
		}
	})
	t.Run("a late report on an expired lease still lands", func(t *testing.T) {
		l := f.acquire(t, `{"proxy":"c","target":"late.example","ttlSeconds":5}`)
		f.clock.Step(10 * time.Second)
		if a := f.call(t, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"banned"}`); a.status != http.StatusNoContent {
			t.Fatalf("late report = %d %s", a.status, a.body)
		}
		if cds := find(t, f.list(t, ""), "c").Cooldowns; len(cds) != 1 || cds[0].Target != "late.example" {
			t.Errorf("cooldowns = %+v", cds)
		}
	})
}

func TestAPIRejectsBadInputWithoutChangingState(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{MaxTTL: time.Hour}, leaseapi.APIOptions{}, testMembers(t))
	lease := f.acquire(t, `{"proxy":"a","target":"example.com"}`)
	snapshot := func() string {
		b, err := json.Marshal(f.list(t, ""))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := snapshot()
	huge := `{"selector":{"k":"` + strings.Repeat("x", leaseapi.MaxAPIBodyBytes) + `"}}`
	report := "/v1/leases/" + lease.LeaseID + "/report"

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code, inMessage          string
	}{
		{"TTL above the maximum names it", "POST", "/v1/leases", `{"ttlSeconds":3601}`, 400, "ttl_too_long", "3600"},
		{"huge TTL", "POST", "/v1/leases", `{"ttlSeconds":9223372036854775807}`, 400, "ttl_too_long", "3600"},
		{"negative TTL", "POST", "/v1/leases", `{"ttlSeconds":-1}`, 400, "invalid_ttl", "negative"},
		{"fractional TTL", "POST", "/v1/leases", `{"ttlSeconds":1.5}`, 400, "bad_request", "ttlSeconds"},
		{"malformed JSON", "POST", "/v1/leases", `{"selector":`, 400, "bad_request", "truncated"},
		{"not JSON", "POST", "/v1/leases", `selector=eu`, 400, "bad_request", "malformed"},
		{"unknown field", "POST", "/v1/leases", `{"selectr":{}}`, 400, "bad_request", "selectr"},
		{"trailing data", "POST", "/v1/leases", `{} {}`, 400, "bad_request", "trailing"},
		{"wrong type", "POST", "/v1/leases", `{"selector":"eu"}`, 400, "bad_request", "selector"},
		{"array instead of object", "POST", "/v1/leases", `[]`, 400, "bad_request", "object"},
		{"null instead of object (once a lease for anything)", "POST", "/v1/leases", ` null `, 400, "bad_request", "JSON null; want a JSON object"},
		{"a URL for a target (once the site \"https\")", "POST", "/v1/leases", `{"target":"https://EXAMPLE.com/x"}`, 400, "bad_request", "is a URL"},
		{"a target with a space", "POST", "/v1/leases", `{"target":"bad host!!"}`, 400, "bad_request", "bad host!!"},
		{"a target with an open bracket", "POST", "/v1/leases", `{"target":"[::1"}`, 400, "bad_request", "not host:port"},
		{"a report on a URL", "POST", report, `{"result":"banned","target":"https://example.com/"}`, 400, "bad_request", "is a URL"},
		{"a null report", "POST", report, `null`, 400, "bad_request", "JSON null"},
		{"empty selector key", "POST", "/v1/leases", `{"selector":{"":"x"}}`, 400, "bad_request", "empty"},
		{"oversized lease body", "POST", "/v1/leases", huge, 413, "body_too_large", "65536"},
		{"unknown report result", "POST", report, `{"result":"meh"}`, 400, "invalid_result", "meh"},
		{"empty report result", "POST", report, `{}`, 400, "invalid_result", "ok, rate_limited"},
		{"negative retry-after", "POST", report, `{"result":"banned","retryAfterSeconds":-5}`, 400, "bad_request", "retryAfterSeconds"},
		{"empty report body", "POST", report, ``, 400, "bad_request", "empty"},
		{"unknown report field", "POST", report, `{"result":"banned","why":"x"}`, 400, "bad_request", "why"},
		{"oversized report body", "POST", report, `{"result":"banned","target":"` + strings.Repeat("x", leaseapi.MaxAPIBodyBytes) + `"}`, 413, "body_too_large", "65536"},
		{"report on an unknown lease", "POST", "/v1/leases/nope/report", `{"result":"banned"}`, 404, "unknown_lease", "nope"},
		{"wrong method on the list", "POST", "/v1/proxies", ``, 405, "method_not_allowed", "GET"},
		{"wrong method on a lease", "GET", "/v1/leases/" + lease.LeaseID, ``, 405, "method_not_allowed", "DELETE"},
		{"wrong method on leases", "GET", "/v1/leases", ``, 405, "method_not_allowed", "POST"},
		{"wrong method on report", "GET", report, ``, 405, "method_not_allowed", "POST"},
		{"unknown path", "GET", "/v2/proxies", ``, 404, "not_found", "/v2/proxies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := f.call(t, tc.method, tc.path, tc.body)
			if a.status != tc.status {
				t.Fatalf("status %d body %s, want %d", a.status, a.body, tc.status)
			}
			if code := a.errorCode(t); code != tc.code {
				t.Errorf("error code %q, want %q", code, tc.code)
			}
			if !bytes.Contains(a.body, []byte(tc.inMessage)) {
				t.Errorf("body %s does not mention %q", a.body, tc.inMessage)
			}
			if tc.status == http.StatusMethodNotAllowed && a.header.Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
			if after := snapshot(); after != before {
				t.Errorf("state changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestAPIBearerAuth(t *testing.T) {
	const token = "s3cr3t-token"
	secured := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: token}, testMembers(t))
	open := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))

	for _, tc := range []struct {
		name    string
		f       *apiFixture
		method  string
		path    string
		auth    string // "-" sends no Authorization header
		status  int
		wantWWW bool
	}{
		{"no token is 401", secured, "GET", "/v1/proxies", "-", 401, true},
		{"wrong token is 401", secured, "GET", "/v1/proxies", "Bearer nope", 401, true},
		{"token prefix is 401", secured, "GET", "/v1/proxies", "Bearer s3cr3t", 401, true},
		{"token with extra bytes is 401", secured, "GET", "/v1/proxies", "Bearer s3cr3t-token2", 401, true},
		{"basic scheme is 401", secured, "GET", "/v1/proxies", "Basic czNjcjN0LXRva2Vu", 401, true},
		{"acquire without token is 401", secured, "POST", "/v1/leases", "-", 401, true},
		{"right token is 200", secured, "GET", "/v1/proxies", "Bearer " + token, 200, false},
		{"scheme is case-insensitive", secured, "GET", "/v1/proxies", "bearer " + token, 200, false},
		{"healthz needs no token", secured, "GET", "/healthz", "-", 200, false},
		{"no token configured: open", open, "GET", "/v1/proxies", "-", 200, false},
		{"no token configured: any token accepted", open, "POST", "/v1/leases", "Bearer whatever", 201, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.f.srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.auth != "-" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := tc.f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d body %s, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.wantWWW {
				if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("WWW-Authenticate = %q", got)
				}
				a := apiAnswer{status: resp.StatusCode, header: resp.Header, body: body}
				if code := a.errorCode(t); code != "unauthorized" {
					t.Errorf("code %q", code)
				}
			}
			if tc.path == "/healthz" && string(body) != "ok" {
				t.Errorf("healthz body %q", body)
			}
		})
	}
	if got := find(t, secured.list(t, ""), "a").ActiveLeases; got != 0 {
		t.Errorf("an unauthenticated acquire created a lease (activeLeases %d)", got)
	}
}

// recorder counts outcomes; safe for the server's goroutines.
type recorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *recorder) LeaseRequest(outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[outcome]++
}

func TestAPIRecordsLeaseOutcomes(t *testing.T) {
	rec := &recorder{}
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Recorder: rec}, testMembers(t))
	f.acquire(t, `{}`)
	f.acquire(t, `{"proxy":"b"}`)
	f.call(t, http.MethodPost, "/v1/leases", `{"proxy":"zz"}`)
	f.call(t, http.MethodPost, "/v1/leases", `{"ttlSeconds":-3}`)
	f.call(t, http.MethodPost, "/v1/leases", `{bad`)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := map[string]int{leaseapi.LeaseOutcomeGranted: 2, leaseapi.LeaseOutcomeNoMatch: 1, leaseapi.LeaseOutcomeInvalid: 2}
	for k, v := range want {
		if rec.n[k] != v {
			t.Errorf("outcome %q counted %d, want %d (all: %v)", k, rec.n[k], v, rec.n)
		}
	}
}

// panickyBackend is the real Store with a ListMembers that panics, to prove the
// recover middleware answers 500 JSON and the server keeps serving.
type panickyBackend struct{ *pool.Store }

func (panickyBackend) ListMembers(context.Context) ([]pool.MemberStatus, error) { panic("boom") }

func TestAPIRecoversFromPanics(t *testing.T) {
	st := pool.NewStore(pool.StoreOptions{})
	st.SetMembers(testMembers(t))
	var logs bytes.Buffer
	var logMu sync.Mutex
	srv := httptest.NewServer(leaseapi.NewAPIServer(panickyBackend{st}, leaseapi.APIOptions{
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)),
	}))
	defer srv.Close()
	f := &apiFixture{srv: srv}
	a := f.call(t, http.MethodGet, "/v1/proxies", "")
	if a.status != http.StatusInternalServerError || a.errorCode(t) != "internal" {
		t.Errorf("status %d body %s, want 500 internal", a.status, a.body)
	}
	if a := f.call(t, http.MethodPost, "/v1/leases", `{}`); a.status != http.StatusCreated {
		t.Errorf("after a panic, acquire = %d %s", a.status, a.body)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "boom") {
		t.Errorf("panic not logged: %s", logs.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestAPIOversizedChunkedBodyIs413(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{}, testMembers(t))
	// No Content-Length: the limit must be enforced while reading.
	body := io.MultiReader(strings.NewReader(`{"target":"`), strings.NewReader(strings.Repeat("x", 2*leaseapi.MaxAPIBodyBytes)), strings.NewReader(`"}`))
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/leases", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := apiAnswer{status: resp.StatusCode, header: resp.Header, body: b}
	if a.status != http.StatusRequestEntityTooLarge || a.errorCode(t) != "body_too_large" {
		t.Errorf("status %d body %s, want 413 body_too_large", a.status, a.body)
	}
	if req.ContentLength != 0 {
		t.Fatalf("test sent a Content-Length (%d); it must exercise the streaming limit", req.ContentLength)
	}
	for _, p := range f.list(t, "").Proxies {
		if p.ActiveLeases != 0 {
			t.Errorf("%s has %d leases after a rejected request", p.Name, p.ActiveLeases)
		}
	}
}
