package leases

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// reviewCounter counts the TokenReviews the Reviewer creates.
type reviewCounter struct {
	client.Client
	n atomic.Int64
}

func (c *reviewCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*authenticationv1.TokenReview); ok {
		c.n.Add(1)
	}
	return c.Client.Create(ctx, obj, opts...)
}

// serviceAccountToken creates a service account in ns and asks the API
// server for a token for audience (TokenRequest, as the kubelet does for a
// projected volume).
func serviceAccountToken(t *testing.T, ns, name, audience string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := env.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](600)}}
	if err := env.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// leaseUserRole is the chart's ClusterRole proxyfleet-lease-user.
func leaseUserRole(t *testing.T) {
	t.Helper()
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: LeaseUserClusterRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{LeaseGroup}, Resources: []string{LeaseResource}, Verbs: []string{LeaseVerb}}}}
	if err := env.Client.Create(context.Background(), cr); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func bindLeaseUser(t *testing.T, ns, sa string) {
	t.Helper()
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "lease-" + sa, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: LeaseUserClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}
	if err := env.Client.Create(context.Background(), rb); err != nil {
		t.Fatal(err)
	}
}

func statusOf(err error) int {
	var ae *leaseapi.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func TestLeaseAPIAcceptsProjectedServiceAccountTokensThroughTokenAndAccessReviews(t *testing.T) {
	counter := &reviewCounter{Client: env.Client}
	reviewer := &Reviewer{Client: counter, TTL: time.Minute}
	r := startAPIWith(t, "static-token", func(o *Options) { o.Reviewer = reviewer })
	r.external(t, "px-a", "127.0.0.1", map[string]string{"region": "eu"})
	r.setHealthy(t, "px-a", true, 5)
	crawlNS := r.ns
	leaseUserRole(t)
	bindLeaseUser(t, crawlNS, "crawler")
	allowed := serviceAccountToken(t, crawlNS, "crawler", DefaultTokenAudience)
	unbound := serviceAccountToken(t, crawlNS, "stranger", DefaultTokenAudience)
	wrongAudience := serviceAccountToken(t, crawlNS, "crawler", "https://kubernetes.default.svc")

	ctx := context.Background()
	// The first Proxy reaches the source asynchronously: only a 409 is retried.
	acquire := func(token string) error {
		var last error
		_ = poll.Wait(wait, "the first Proxy at the source", func() error {
			_, last = r.client(t, token).Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
			var nm *pool.NoMatchError
			if errors.As(last, &nm) {
				return last
			}
			return nil
		})
		return last
	}
	for _, tc := range []struct {
		name   string
		token  string
		status int // 0: granted
	}{
		{"a bound service account's token is granted a lease", allowed, 0},
		{"a service account without the RoleBinding is refused with 403", unbound, http.StatusForbidden},
		{"a token for another audience is refused with 401", wrongAudience, http.StatusUnauthorized},
		{"a token nobody issued is refused with 401", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", http.StatusUnauthorized},
		{"the static token keeps working beside the reviews", "static-token", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := acquire(tc.token)
			if got := statusOf(err); got != tc.status || (tc.status == 0 && err != nil) {
				t.Fatalf("acquire: status %d (%v), want %d", got, err, tc.status)
			}
		})
	}
	t.Run("reviews are cached, so the API server is not asked per lease", func(t *testing.T) {
		before := counter.n.Load()
		for range 5 {
			if err := acquire(allowed); err != nil {
				t.Fatal(err)
			}
		}
		if got := counter.n.Load() - before; got != 0 {
			t.Fatalf("%d TokenReviews for 5 leases with a cached token, want 0", got)
		}
	})
	t.Run("a 403 names the ClusterRole to bind and never echoes the token", func(t *testing.T) {
		err := acquire(unbound)
		if err == nil {
			t.Fatal("unbound token was granted")
		}
		msg := err.Error()
		if !contains(msg, LeaseUserClusterRole) || contains(msg, unbound) {
			t.Fatalf("403 message %q: want the ClusterRole named and no token", msg)
		}
	})
}

func TestReviewerCacheIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &Reviewer{MaxEntries: 3, Clock: clocktesting.NewFakePassiveClock(now)}
	for i := range 10 {
		r.store([32]byte{byte(i)}, reviewEntry{expires: now.Add(time.Minute)}, now)
	}
	if r.Len() > 3 {
		t.Fatalf("cache holds %d entries, bound is 3", r.Len())
	}
}

func contains(s, sub string) bool { return sub != "" && strings.Contains(s, sub) }
