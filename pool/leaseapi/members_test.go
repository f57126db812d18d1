package leaseapi_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestAPIListWithCredentialsIsALeaseAnswer checks credentials=true: the
// URLs carry their passwords, the answer is no-store like a lease's, and
// without it (or with false) nothing secret shows.
func TestAPIListWithCredentialsIsALeaseAnswer(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: "t0ken"}, testMembers(t))
	a := f.call(t, http.MethodGet, "/v1/proxies?credentials=true", "")
	if a.status != http.StatusOK || !strings.Contains(string(a.body), "user:secret-a@127.0.0.1:3128") {
		t.Fatalf("credentials=true: %d %s, want the URLs with their passwords", a.status, a.body)
	}
	if cc := a.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("credentials=true: Cache-Control %q, want no-store", cc)
	}
	for _, q := range []string{"", "?credentials=false"} {
		if a := f.call(t, http.MethodGet, "/v1/proxies"+q, ""); strings.Contains(string(a.body), "secret") || a.header.Get("Cache-Control") != "" {
			t.Errorf("GET /v1/proxies%s shows a password or is marked no-store: %v %s", q, a.header, a.body)
		}
	}
	if a := f.call(t, http.MethodGet, "/v1/proxies?credentials=yes", ""); a.status != http.StatusBadRequest || a.errorCode(t) != "bad_request" {
		t.Errorf("credentials=yes: %d %s, want 400 bad_request", a.status, a.body)
	}
	// The list stays behind the token.
	if a := f.call(t, http.MethodGet, "/v1/proxies?credentials=true", "", "Authorization", "Bearer wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("credentials=true with a wrong token: %d, want 401", a.status)
	}
}

// TestClientMembersIsTheLastKnownPool checks that Members returns what a
// gateway needs to lease by itself: usable URLs with credentials, health,
// latency and cooldowns, narrowed to the client's default selector.
func TestClientMembersIsTheLastKnownPool(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: "t0ken"}, testMembers(t))
	f.store.SetHealth("b", false, 0)
	f.store.SetHealth("a", true, 42*time.Millisecond)
	ctx := context.Background()
	l := f.acquire(t, `{"proxy":"a","target":"site.example"}`)
	if err := f.store.Report(ctx, l.LeaseID, pool.Report{Result: rotation.ResultBanned}); err != nil {
		t.Fatal(err)
	}
	c, err := leaseapi.NewClientWith(f.srv.URL, leaseapi.ClientOptions{Token: "t0ken", Selector: map[string]string{"region": "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Name != "a" || ms[1].Name != "b" {
		t.Fatalf("members %+v, want a and b (region=eu)", ms)
	}
	a, b := ms[0], ms[1]
	if a.URL.String() != "http://user:secret-a@127.0.0.1:3128" || a.Attributes["tier"] != "dc" ||
		!a.Healthy || a.Latency != 42*time.Millisecond || a.ActiveLeases != 1 {
		t.Errorf("a = %+v (url %s), want its URL with credentials, attributes, health and latency", a, a.URL)
	}
	if until := a.Cooldowns["site.example"]; until.IsZero() {
		t.Errorf("a's cooldowns %v, want the one for site.example", a.Cooldowns)
	}
	if b.Healthy {
		t.Error("b is listed healthy; the API said it is not")
	}
}

// TestIsOutageTellsAnOutageFromARefusal pins which errors make a gateway
// serve from its last-known pool: no answer or a 5xx, never an answer about
// the request.
func TestIsOutageTellsAnOutageFromARefusal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{pool.ErrUnreachable, true},
		{&leaseapi.APIError{Status: 503, Code: "store_unavailable"}, true},
		{&leaseapi.APIError{Status: 500, Code: "internal"}, true},
		{&leaseapi.APIError{Status: 502}, true},
		{&leaseapi.APIError{Status: 401, Code: "unauthorized"}, false},
		{&leaseapi.APIError{Status: 400, Code: "bad_request"}, false},
		{&pool.NoMatchError{Considered: 3}, false},
		{pool.ErrTTLTooLong, false},
		{errors.New("something else"), false},
	} {
		if got := leaseapi.IsOutage(tc.err); got != tc.want {
			t.Errorf("IsOutage(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
