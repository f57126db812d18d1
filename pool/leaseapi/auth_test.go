package leaseapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// reviewerFunc adapts a function to leaseapi.TokenReviewer.
type reviewerFunc func(ctx context.Context, token string) error

func (f reviewerFunc) ReviewToken(ctx context.Context, token string) (pool.Client, error) {
	return pool.Client{}, f(ctx, token)
}

func TestAPIServerAsksTheReviewerAboutTokensOtherThanTheStaticOne(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	rev := reviewerFunc(func(_ context.Context, token string) error {
		mu.Lock()
		asked = append(asked, token)
		mu.Unlock()
		switch token {
		case "pod-ok":
			return nil
		case "pod-denied":
			return fmt.Errorf("%w: sa crawl/x may not", leaseapi.ErrTokenForbidden)
		case "pod-down":
			return errors.New("TokenReview: connection refused")
		}
		return fmt.Errorf("%w: not valid", leaseapi.ErrTokenInvalid)
	})
	srv := httptest.NewServer(leaseapi.NewAPIServer(pool.NewStore(pool.StoreOptions{}), leaseapi.APIOptions{Token: "static", Reviewer: rev}))
	defer srv.Close()
	for _, tc := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"the static token passes without a review", "static", http.StatusOK, ""},
		{"a token the reviewer vouches for passes", "pod-ok", http.StatusOK, ""},
		{"a valid identity without the right is a 403", "pod-denied", http.StatusForbidden, "forbidden"},
		{"an unknown token is a 401", "garbage", http.StatusUnauthorized, "unauthorized"},
		{"a reviewer that cannot decide is a 503 (the client retries)", "pod-down", http.StatusServiceUnavailable, "auth_unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/proxies", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct{ Error, Message string }
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != tc.status || body.Error != tc.code {
				t.Fatalf("status %d %q, want %d %q", resp.StatusCode, body.Error, tc.status, tc.code)
			}
			if strings.Contains(body.Message, tc.token) && tc.token != "" && tc.status != http.StatusOK {
				t.Fatalf("the answer echoes the token: %q", body.Message)
			}
		})
	}
	for _, a := range asked {
		if a == "static" {
			t.Fatal("the static token was sent to the reviewer")
		}
	}
}

func TestAPIServerWithOnlyAReviewerRequiresAToken(t *testing.T) {
	srv := httptest.NewServer(leaseapi.NewAPIServer(pool.NewStore(pool.StoreOptions{}),
		leaseapi.APIOptions{Reviewer: reviewerFunc(func(context.Context, string) error { return nil })}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/proxies")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token with a reviewer: %d, want 401", resp.StatusCode)
	}
}

// recordingAPI answers POST /v1/leases with a 409 and records what came.
type recordingAPI struct {
	mu        sync.Mutex
	auth      []string
	selectors []map[string]string
}

func (r *recordingAPI) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Selector map[string]string `json:"selector"`
	}
	_ = json.NewDecoder(req.Body).Decode(&body)
	r.mu.Lock()
	r.auth = append(r.auth, req.Header.Get("Authorization"))
	r.selectors = append(r.selectors, body.Selector)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusConflict)
	_, _ = w.Write([]byte(`{"error":"no_match","message":"none","considered":0}`))
}

func TestClientRereadsARotatingTokenFile(t *testing.T) {
	rec := &recordingAPI{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := leaseapi.NewClientWith(srv.URL, leaseapi.ClientOptions{TokenFile: path, TokenFileRefresh: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Acquire(context.Background(), pool.AcquireRequest{})
	// The kubelet swaps the file atomically (a rename).
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	_, _ = c.Acquire(context.Background(), pool.AcquireRequest{})
	// A failed read keeps the last good token.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	_, _ = c.Acquire(context.Background(), pool.AcquireRequest{})
	want := []string{"Bearer first", "Bearer second", "Bearer second"}
	if strings.Join(rec.auth, "|") != strings.Join(want, "|") {
		t.Fatalf("Authorization headers %q, want %q", rec.auth, want)
	}
}

func TestClientTokenFileMustBeReadableAndExcludesAFixedToken(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    leaseapi.ClientOptions
		want string
	}{
		{"a missing file", leaseapi.ClientOptions{TokenFile: "/nonexistent/token"}, "token file"},
		{"an empty file", leaseapi.ClientOptions{TokenFile: empty}, "empty"},
		{"both a token and a file", leaseapi.ClientOptions{Token: "x", TokenFile: empty}, "exclude each other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := leaseapi.NewClientWith("http://127.0.0.1:1", tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewClientWith: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestClientMergesItsDefaultSelectorUnderTheRequests(t *testing.T) {
	rec := &recordingAPI{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := leaseapi.NewClientWith(srv.URL, leaseapi.ClientOptions{Selector: map[string]string{"region": "eu", "tier": "dc"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Acquire(context.Background(), pool.AcquireRequest{})
	_, _ = c.Acquire(context.Background(), pool.AcquireRequest{Selector: map[string]string{"tier": "res", "asn": "1"}})
	got := fmt.Sprint(rec.selectors)
	want := fmt.Sprint([]map[string]string{{"region": "eu", "tier": "dc"}, {"region": "eu", "tier": "res", "asn": "1"}})
	if got != want {
		t.Fatalf("selectors sent %s, want %s", got, want)
	}
}

func TestParseSelector(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "map[]", ""},
		{"region=eu, tier=dc", "map[region:eu tier:dc]", ""},
		{"region", "", "not key=value"},
		{"region=", "", "empty key or value"},
		{"a=b=c", "", "no blanks, control characters or '='"},
		{"a=1,a=2", "", "given twice"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := pool.ParseSelector(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseSelector(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || fmt.Sprint(map[string]string(got)) != tc.want && !(len(got) == 0 && tc.want == "map[]") {
				t.Fatalf("ParseSelector(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

// namingReviewer vouches for every token but "static" as a pod of the
// namespace the token names.
type namingReviewer struct{}

func (namingReviewer) ReviewToken(_ context.Context, token string) (pool.Client, error) {
	return pool.Client{Namespace: token, ServiceAccount: "crawler"}, nil
}

// clientBackend refuses, as the controller's tenancy does, every acquire of
// a client whose namespace is "team-b", and records who asked.
type clientBackend struct {
	pool.APIBackend
	mu    sync.Mutex
	asked []pool.Client
}

func (b *clientBackend) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	c := pool.ClientFrom(ctx)
	b.mu.Lock()
	b.asked = append(b.asked, c)
	b.mu.Unlock()
	if c.Namespace == "team-b" {
		return pool.Lease{}, fmt.Errorf("%w: namespace team-b may not lease pool fleet/eu", pool.ErrForbidden)
	}
	return b.APIBackend.Acquire(ctx, req)
}

type outcomes struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *outcomes) LeaseRequest(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[outcome]++
}

// The caller a reviewer vouches for reaches the backend in the request's
// context, and a backend's pool.ErrForbidden is a 403 not_shared with its
// message, counted as its own outcome, that a client reads as
// pool.ErrForbidden: the wire contract of tenancy (docs/tenancy.md).
func TestAPIServerHandsTheReviewedClientToTheBackendAndAnswersItsRefusal(t *testing.T) {
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers([]pool.Member{{Name: "fleet/eu-1", Attributes: map[string]string{"region": "eu"}}})
	b := &clientBackend{APIBackend: store}
	rec := &outcomes{n: map[string]int{}}
	srv := httptest.NewServer(leaseapi.NewAPIServer(b, leaseapi.APIOptions{Token: "static", Reviewer: namingReviewer{}, Recorder: rec}))
	defer srv.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name, token string
		want        pool.Client
		refused     bool
	}{
		{"a reviewed pod's namespace reaches the backend", "team-a", pool.Client{Namespace: "team-a", ServiceAccount: "crawler"}, false},
		{"the static token is the unnamed caller", "static", pool.Client{}, false},
		{"a refusal of the backend is 403 not_shared with its message", "team-b", pool.Client{Namespace: "team-b", ServiceAccount: "crawler"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := leaseapi.NewClient(srv.URL, tc.token, nil)
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
			b.mu.Lock()
			got := b.asked[len(b.asked)-1]
			b.mu.Unlock()
			if got != tc.want {
				t.Errorf("backend saw %+v, want %+v", got, tc.want)
			}
			if !tc.refused {
				if err != nil {
					t.Fatal(err)
				}
				_ = c.Release(ctx, l.ID)
				return
			}
			var ae *leaseapi.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Code != "not_shared" ||
				!strings.Contains(ae.Message, "team-b may not lease pool fleet/eu") || !errors.Is(err, pool.ErrForbidden) {
				t.Fatalf("acquire = %v; want 403 not_shared with the backend's message, read as pool.ErrForbidden", err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.n[leaseapi.LeaseOutcomeNotShared] != 1 {
				t.Errorf("outcomes %v, want one %s", rec.n, leaseapi.LeaseOutcomeNotShared)
			}
		})
	}
}
