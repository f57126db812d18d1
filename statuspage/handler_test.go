package statuspage

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

const (
	secretPassword = "s3cr3t-upstream-pass"
	secretUser     = "customer-zone-x"
)

// gatewayFixture is a pool with a credentialed member, a direct one and
// an unhealthy one, with cooldowns of every kind.
func gatewayFixture(now time.Time) GatewayInput {
	u, _ := url.Parse("http://" + secretUser + ":" + secretPassword + "@10.0.3.7:3128/?token=" + secretPassword + "#" + secretPassword)
	v, _ := url.Parse("socks5://10.0.3.8:1080")
	return GatewayInput{
		Pool: PoolSnapshot{
			Members: []pool.MemberStatus{
				{Member: pool.Member{Name: "squid-b", URL: v}, Healthy: false},
				{Member: pool.Member{Name: "squid-a", URL: u, Attributes: map[string]string{"region": "eu"}}, Healthy: true,
					Latency: 42 * time.Millisecond, ActiveLeases: 3, Cooldowns: map[string]time.Time{"shop.com": now.Add(time.Minute), "": now.Add(time.Second)}},
				{Member: pool.Member{Name: "direct"}, Healthy: true},
			},
			Cooldowns: []pool.Cooldown{
				{Member: "squid-a", Target: "shop.com", Until: now.Add(90*time.Second + time.Millisecond), Reason: rotation.ResultBanned},
				{Member: "squid-a", Target: "", Until: now.Add(time.Second), Reason: rotation.ResultUpstreamFailed},
				{Member: "squid-b", Target: "news.com", Until: now.Add(-time.Second), Reason: rotation.ResultRateLimited},
			},
		},
		Requests: Chart{BucketSeconds: 30, Bars: 1, Series: []Series{{Outcome: "ok", Counts: []int64{5}, Total: 5}}, Total: 5},
	}
}

func TestGatewayViewShowsMembersCooldownsAndStatesWithoutCredentials(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	v := Gateway(gatewayFixture(now), now)
	names := []string{}
	for _, m := range v.Members {
		names = append(names, m.Name+"|"+m.URL+"|"+m.State)
	}
	want := []string{"direct|direct://|ok", "squid-a|http://10.0.3.7:3128/|failing", "squid-b|socks5://10.0.3.8:1080|unhealthy"}
	if !slices.Equal(names, want) {
		t.Fatalf("members\n got %q\nwant %q", names, want)
	}
	if v.ActiveLeases != 3 || v.Members[1].LatencyMillis != 42 || v.Members[1].Cooldowns != 2 || v.Members[1].Attributes["region"] != "eu" {
		t.Fatalf("squid-a row %+v, leases %d", v.Members[1], v.ActiveLeases)
	}
	var cools []string
	for _, c := range v.Cooldowns {
		cools = append(cools, c.Site+"|"+c.Member+"|"+c.Reason)
	}
	if want := []string{"*|squid-a|upstream_failed", "shop.com|squid-a|banned"}; !slices.Equal(cools, want) {
		t.Fatalf("cooldowns (ended ones left out, every-site first)\n got %q\nwant %q", cools, want)
	}
	if v.Cooldowns[1].SecondsLeft != 91 {
		t.Fatalf("seconds left %d, want 91 (rounded up)", v.Cooldowns[1].SecondsLeft)
	}
	if v.Pool != "own" || len(v.Notes) != 0 || len(v.Errors) != 0 {
		t.Fatalf("own pool view: %+v", v)
	}
}

func TestGatewayViewInPoolAPIModeSaysWhereMembersComeFrom(t *testing.T) {
	now := time.Now()
	in := gatewayFixture(now)
	in.PoolAPI = "https://ctl:" + secretPassword + "@proxyfleet.proxyfleet.svc:8090/?t=" + secretPassword
	in.Pool.Err = "the lease API could not be read"
	v := Gateway(in, now)
	if v.Pool != "pool-api" || v.PoolAPI != "https://proxyfleet.proxyfleet.svc:8090/" || len(v.Notes) != 1 {
		t.Fatalf("pool %q api %q notes %q", v.Pool, v.PoolAPI, v.Notes)
	}
	if !slices.Equal(v.Errors, []string{"the lease API could not be read"}) {
		t.Fatalf("errors %q", v.Errors)
	}
}

// TestGatewayViewShowsALeaseAPIOutage checks the three states of an
// outage: serving from the last-known list until the grace ends, refusing
// beyond it, and refusing with no list ever received; each says so.
func TestGatewayViewShowsALeaseAPIOutage(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		outage Outage
		want   string
	}{
		{"serving", Outage{Since: now.Add(-time.Minute), LastAnswer: now.Add(-time.Minute), ListAt: now.Add(-90 * time.Second), GraceEnds: now.Add(4 * time.Minute)},
			"the gateway leases from its last-known members (listed at 2030-01-01T11:58:30Z) until 2030-01-01T12:04:00Z (--pool-outage-grace)"},
		{"beyond the grace", Outage{Since: now.Add(-6 * time.Minute), LastAnswer: now.Add(-6 * time.Minute), ListAt: now.Add(-7 * time.Minute), Refusing: true},
			"longer than --pool-outage-grace after its last answer (2030-01-01T11:54:00Z): requests get 503 pool_unreachable"},
		{"no list", Outage{Since: now.Add(-time.Minute), Refusing: true},
			"no member list was ever received from it: requests get 503 pool_unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := gatewayFixture(now)
			in.PoolAPI = "http://proxyfleet.proxyfleet.svc:8090"
			o := tc.outage
			in.Pool.Outage = &o
			v := Gateway(in, now)
			if v.Outage == nil || len(v.Errors) != 1 || !strings.Contains(v.Errors[0], tc.want) {
				t.Fatalf("outage %+v errors %q, want one saying %q", v.Outage, v.Errors, tc.want)
			}
		})
	}
}

func TestMembersFromAPIKeepsTheListingAndDropsNothingButReasons(t *testing.T) {
	until := time.Unix(1_700_000_100, 0).UTC()
	ms, cs := MembersFromAPI([]leaseapi.ProxyInfo{
		{Name: "px-1", URL: "http://user:xxxxx@10.0.0.1:3128", Healthy: true, LatencyMillis: 12, ActiveLeases: 2,
			Cooldowns: []leaseapi.CooldownInfo{{Target: "shop.com", Until: until}}},
		{Name: "d", URL: "direct://127.0.0.9"},
		{Name: "bad", URL: "::"},
	})
	rows := Members(ms)
	got := []string{}
	for _, r := range rows {
		got = append(got, r.Name+"|"+r.URL+"|"+r.State)
	}
	if want := []string{"bad|invalid://invalid|unhealthy", "d|direct://127.0.0.9|unhealthy", "px-1|http://10.0.0.1:3128|ok"}; !slices.Equal(got, want) {
		t.Fatalf("rows\n got %q\nwant %q", got, want)
	}
	if len(cs) != 1 || cs[0] != (pool.Cooldown{Member: "px-1", Target: "shop.com", Until: until}) {
		t.Fatalf("cooldowns %+v", cs)
	}
}

func TestFleetViewCountsPhasesAndOrdersProxiesNeedingAttentionFirst(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	v := Fleet(FleetInput{
		Proxies: []Proxy{
			{Namespace: "ns", Name: "b", Phase: "Ready", CreatedAt: now.Add(-time.Hour)},
			{Namespace: "ns", Name: "a", Phase: "Ready", CreatedAt: now.Add(time.Minute)},
			{Namespace: "ns", Name: "c", Phase: "Failed"},
			{Namespace: "ns", Name: "new"},
		},
		Providers:  []Provider{{Name: "z"}, {Name: "a", Targets: []ProviderTarget{}}},
		LeaseStore: true,
		Pool:       PoolSnapshot{Err: "the lease store could not be read"},
		Errors:     []string{"ProxyPools could not be listed"},
	}, now)
	var order []string
	for _, p := range v.Proxies {
		order = append(order, p.Name+"|"+p.Phase)
	}
	if want := []string{"c|Failed", "new|Pending", "a|Ready", "b|Ready"}; !slices.Equal(order, want) {
		t.Fatalf("order %q, want %q", order, want)
	}
	if v.Phases["Ready"] != 2 || v.Phases["Pending"] != 1 || v.Phases["Failed"] != 1 {
		t.Fatalf("phases %v", v.Phases)
	}
	if v.Proxies[3].AgeSeconds != 3600 || v.Proxies[2].AgeSeconds != 0 {
		t.Fatalf("ages %d %d", v.Proxies[3].AgeSeconds, v.Proxies[2].AgeSeconds)
	}
	if v.Providers[0].Name != "a" || len(v.Errors) != 2 || v.Pools == nil || v.Members == nil || v.Cooldowns == nil {
		t.Fatalf("view %+v", v)
	}
}

// get fetches path from h.
func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHandlerServesThePageAndItsJSONAndNothingElse(t *testing.T) {
	now := time.Now()
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics") })
	h := Handler(HandlerOptions{Title: "proxyfleet <gateway>", View: func(context.Context) any { return Gateway(gatewayFixture(now), now) }, Next: next})

	page := get(t, h, http.MethodGet, PagePath)
	html := body(t, page)
	if page.StatusCode != 200 || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", page.StatusCode, page.Header.Get("Content-Type"))
	}
	if !strings.Contains(html, "<title>proxyfleet &lt;gateway&gt;</title>") {
		t.Fatal("the title is not escaped into the page")
	}
	if c := page.Header.Get("Content-Security-Policy"); !strings.Contains(c, "default-src 'none'") || !strings.Contains(c, hash(pageJS)) {
		t.Fatalf("CSP %q does not pin the inline script", c)
	}
	for _, ext := range []string{"src=\"http", "href=\"http", "@import", "url(http"} {
		if strings.Contains(html, ext) {
			t.Fatalf("the page loads an external asset (%s)", ext)
		}
	}

	js := get(t, h, http.MethodGet, JSONPath)
	var shape map[string]any
	if err := json.Unmarshal([]byte(body(t, js)), &shape); err != nil || js.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("json: %v, headers %v", err, js.Header)
	}
	for _, k := range []string{"kind", "generatedAt", "refreshSeconds", "pool", "members", "activeLeases", "cooldowns", "requests", "errors", "notes"} {
		if _, ok := shape[k]; !ok {
			t.Errorf("JSON has no %q", k)
		}
	}
	m := shape["members"].([]any)[1].(map[string]any)
	for _, k := range []string{"name", "url", "state", "healthy", "latencyMillis", "activeLeases", "cooldowns", "attributes"} {
		if _, ok := m[k]; !ok {
			t.Errorf("member has no %q", k)
		}
	}
	c := shape["cooldowns"].([]any)[0].(map[string]any)
	for _, k := range []string{"site", "member", "until", "secondsLeft", "reason"} {
		if _, ok := c[k]; !ok {
			t.Errorf("cooldown has no %q", k)
		}
	}
	r := shape["requests"].(map[string]any)
	for _, k := range []string{"bucketSeconds", "start", "bars", "series", "total"} {
		if _, ok := r[k]; !ok {
			t.Errorf("requests has no %q", k)
		}
	}

	if r := get(t, h, http.MethodPost, JSONPath); r.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %d, want 405 (read-only)", JSONPath, r.StatusCode)
	}
	if r := get(t, h, http.MethodGet, "/metrics"); body(t, r) != "metrics" {
		t.Fatal("other paths do not reach Next")
	}
	alone := Handler(HandlerOptions{Title: "c", View: func(context.Context) any { return nil }})
	if r := get(t, alone, http.MethodGet, "/"); r.StatusCode != http.StatusFound || r.Header.Get("Location") != PagePath {
		t.Fatalf("/ without Next: %d %q", r.StatusCode, r.Header.Get("Location"))
	}
	if r := get(t, alone, http.MethodGet, "/other"); r.StatusCode != http.StatusNotFound {
		t.Fatalf("/other without Next: %d", r.StatusCode)
	}
}

// TestNoSecretReachesThePageOrItsJSON: a member URL with a user and a
// password (and the password in its query and fragment), and a pool API
// URL carrying one, show in neither the HTML nor the JSON.
func TestNoSecretReachesThePageOrItsJSON(t *testing.T) {
	now := time.Now()
	in := gatewayFixture(now)
	in.PoolAPI = "http://gw:" + secretPassword + "@127.0.0.1:8090"
	h := Handler(HandlerOptions{Title: "proxyfleet gateway", View: func(context.Context) any { return Gateway(in, now) }})
	for _, path := range []string{PagePath, JSONPath} {
		b := body(t, get(t, h, http.MethodGet, path))
		for _, secret := range []string{secretPassword, secretUser} {
			if strings.Contains(b, secret) {
				t.Errorf("%s shows %q", path, secret)
			}
		}
	}
}
