package leaseapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// The lease API keeps token clients' quotas for --lease-api gateways: each
// decision is the server's store's, so every gateway on the API holds a
// client to one quota; a refusal comes back as the store's *quota.Refusal.
func TestClientKeepsQuotasInTheServersStore(t *testing.T) {
	const token = "tok"
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: token}, testMembers(t))
	var c pool.QuotaKeeper = newTestClient(t, f, token)
	ctx := context.Background()
	l := quota.Limits{RPS: 1, Leases: 1, BytesPerDay: 100}
	if err := c.TakeRequest(ctx, "team-a", "a.example", l); err != nil {
		t.Fatal(err)
	}
	var ref *quota.Refusal
	if err := c.TakeRequest(ctx, "team-a", "b.example", l); !errors.As(err, &ref) || ref.Which != quota.WhichRPS || ref.Limit != 1 || ref.RetryAfter != time.Second {
		t.Fatalf("second request at once: %v, want an rps refusal of 1s", err)
	}
	// The server's store holds it: the store itself refuses the client too.
	if err := f.store.TakeRequest(ctx, "team-a", "c.example", l); !errors.As(err, &ref) {
		t.Fatalf("the store's own decision: %v, want a refusal", err)
	}
	f.clock.Step(time.Second)
	if err := c.AddBytes(ctx, "team-a", 150); err != nil {
		t.Fatal(err)
	}
	if err := c.TakeRequest(ctx, "team-a", "a.example", l); !errors.As(err, &ref) || ref.Which != quota.WhichBytes {
		t.Fatalf("past the day's bytes: %v, want bytes-per-day", err)
	}
	if err := c.TakeLease(ctx, "team-a", "h1", l, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.TakeLease(ctx, "team-a", "h2", l, time.Minute); !errors.As(err, &ref) || ref.Which != quota.WhichLeases {
		t.Fatalf("second lease: %v, want a leases refusal", err)
	}
	if err := c.ReturnLease(ctx, "team-a", "h1"); err != nil {
		t.Fatal(err)
	}
	if err := c.TakeLease(ctx, "team-a", "h2", l, time.Minute); err != nil {
		t.Fatalf("after a return: %v", err)
	}
	if a := f.call(t, http.MethodPost, "/v1/quota", `{"op":"request","client":"team-b","site":"x","rps":0.5}`); a.status != http.StatusOK {
		t.Fatalf("first request on the wire: %d %s", a.status, a.body)
	}
	a := f.call(t, http.MethodPost, "/v1/quota", `{"op":"request","client":"team-b","site":"x","rps":0.5}`)
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "2" || !strings.Contains(string(a.body), `"error":"quota_exceeded"`) {
		t.Fatalf("429 on the wire: %d %v %s", a.status, a.header, a.body)
	}
}

func TestQuotaRejectsBadInputNamingTheField(t *testing.T) {
	f := newAPIFixture(t, pool.StoreOptions{}, leaseapi.APIOptions{Token: "tok"}, testMembers(t))
	for _, tc := range []struct{ body, want string }{
		{`{"op":"request","site":"x"}`, "client must be"},
		{`{"op":"request","client":"Team_A","site":"x"}`, "client must be"},
		{`{"op":"request","client":"a"}`, "site must be a host"},
		{`{"op":"request","client":"a","site":"https://x/"}`, "site must be a host"},
		{`{"op":"request","client":"a","site":"x","rps":-1}`, "rps=-1"},
		{`{"op":"lease","client":"a","holder":"h","leases":-2}`, "leases=-2 is negative"},
		{`{"op":"lease","client":"a","leases":2}`, "holder must be"},
		{`{"op":"lease","client":"a","holder":"h","leases":2,"ttlMillis":-1}`, "ttlMillis"},
		{`{"op":"bytes","client":"a","bytes":-5}`, "bytes -5"},
		{`{"op":"bytes","client":"a","bytesPerDay":-5}`, "bytes-per-day=-5"},
		{`{"op":"spend","client":"a"}`, "want request, bytes, lease or return"},
		{`{"op":"request","client":"a","site":"x","extra":1}`, "extra"},
	} {
		a := f.call(t, http.MethodPost, "/v1/quota", tc.body)
		if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.body, a.status, a.body, tc.want)
		}
	}
	if a := f.call(t, http.MethodGet, "/v1/quota", ""); a.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/quota: %d", a.status)
	}
	if a := f.call(t, http.MethodPost, "/v1/quota", `{"op":"bytes","client":"a","bytes":1}`, "Authorization", "Bearer wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", a.status)
	}
}

// A pod identity may not spend or free a token client's quota: the client
// named is a shared gateway's, not the caller's.
func TestQuotaIsTheStaticTokensOnly(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	srv := httptest.NewServer(leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: "static", Reviewer: namingReviewer{}}))
	defer srv.Close()
	pod, err := leaseapi.NewClient(srv.URL, "team-b", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = pod.TakeLease(ctx, "team-a", "h", quota.Limits{Leases: 1}, time.Minute)
	var ae *leaseapi.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || !strings.Contains(ae.Message, "service account team-b/crawler may not spend or free them") {
		t.Fatalf("a pod identity: %v, want 403 naming it", err)
	}
	if err := store.TakeLease(ctx, "team-a", "h0", quota.Limits{Leases: 1}, time.Minute); err != nil {
		t.Fatalf("the refused call took team-a's place: %v", err)
	}
	op, err := leaseapi.NewClient(srv.URL, "static", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.ReturnLease(ctx, "team-a", "h0"); err != nil {
		t.Fatalf("the static token: %v", err)
	}
}
