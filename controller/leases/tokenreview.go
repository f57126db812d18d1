package leases

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// What a lease caller must be allowed, by RBAC, in its own namespace. The
// resource is virtual (no such API object): it exists so that a RoleBinding
// to the chart's ClusterRole LeaseUserClusterRole decides who may lease.
const (
	LeaseGroup    = "proxyfleet.io"
	LeaseResource = "leases"
	LeaseVerb     = "create"
	// LeaseUserClusterRole is the chart's ClusterRole granting LeaseVerb on
	// LeaseResource; bind it in a crawler namespace.
	LeaseUserClusterRole = "proxyfleet-lease-user"
	// DefaultTokenAudience is the audience injected sidecars' tokens carry.
	DefaultTokenAudience = "proxyfleet"
)

// Review cache defaults: short enough that a removed RoleBinding or a
// deleted pod stops leasing soon, long enough that the API server is asked
// once per gateway every half minute, not per lease.
const (
	DefaultReviewTTL         = 30 * time.Second
	DefaultReviewNegativeTTL = 5 * time.Second
	DefaultReviewEntries     = 10000
)

// Reviewer is the lease API's leaseapi.TokenReviewer for projected
// service-account tokens: a TokenReview (the token, for Audience) and a
// SubjectAccessReview (may this service account create leases.proxyfleet.io
// in its namespace), with answers cached by the token's SHA-256, never by
// the token itself, in a bounded map.
type Reviewer struct {
	// Client creates the reviews (the controller needs create on
	// tokenreviews and subjectaccessreviews).
	Client client.Client
	// Audience the token must be for (default DefaultTokenAudience).
	Audience string
	// TTL and NegativeTTL bound how long an allow or a refusal is reused.
	TTL, NegativeTTL time.Duration
	// MaxEntries bounds the cache (default DefaultReviewEntries).
	MaxEntries int
	// Clock is the time source of the cache's expiry; nil is the real clock.
	Clock clock.PassiveClock

	mu      sync.Mutex
	entries map[[sha256.Size]byte]reviewEntry
}

type reviewEntry struct {
	client  pool.Client
	err     error
	expires time.Time
}

var _ leaseapi.TokenReviewer = (*Reviewer)(nil)

func (r *Reviewer) now() time.Time {
	if r.Clock == nil {
		return clock.RealClock{}.Now()
	}
	return r.Clock.Now()
}

// ReviewToken vouches for token, naming the pod identity it belongs to
// (its namespace and service account), or says why not
// (leaseapi.ErrTokenInvalid, leaseapi.ErrTokenForbidden, or another error
// when the API server could not answer).
func (r *Reviewer) ReviewToken(ctx context.Context, token string) (pool.Client, error) {
	key := sha256.Sum256([]byte(token))
	now := r.now()
	r.mu.Lock()
	if e, ok := r.entries[key]; ok && now.Before(e.expires) {
		r.mu.Unlock()
		return e.client, e.err
	}
	r.mu.Unlock()
	c, err, cache := r.review(ctx, token)
	if !cache {
		return pool.Client{}, err
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = DefaultReviewTTL
	}
	if err != nil {
		if ttl = r.NegativeTTL; ttl <= 0 {
			ttl = DefaultReviewNegativeTTL
		}
	}
	r.store(key, reviewEntry{client: c, err: err, expires: now.Add(ttl)}, now)
	return c, err
}

// store adds e, first dropping expired entries and then arbitrary ones
// when the cache is full.
func (r *Reviewer) store(key [sha256.Size]byte, e reviewEntry, now time.Time) {
	max := r.MaxEntries
	if max <= 0 {
		max = DefaultReviewEntries
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[[sha256.Size]byte]reviewEntry{}
	}
	if len(r.entries) >= max {
		for k, v := range r.entries {
			if !now.Before(v.expires) {
				delete(r.entries, k)
			}
		}
		for k := range r.entries {
			if len(r.entries) < max {
				break
			}
			delete(r.entries, k)
		}
	}
	r.entries[key] = e
}

// Len is the number of cached answers.
func (r *Reviewer) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// review asks the API server; cache says whether the answer is a verdict
// (an API failure is not).
func (r *Reviewer) review(ctx context.Context, token string) (c pool.Client, err error, cache bool) {
	aud := r.Audience
	if aud == "" {
		aud = DefaultTokenAudience
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{aud}}}
	if err := r.Client.Create(ctx, tr); err != nil {
		return pool.Client{}, fmt.Errorf("TokenReview: %w", err), false
	}
	if !tr.Status.Authenticated {
		return pool.Client{}, fmt.Errorf("%w: not a valid service-account token for audience %q", leaseapi.ErrTokenInvalid, aud), true
	}
	if len(tr.Status.Audiences) > 0 && !slices.Contains(tr.Status.Audiences, aud) {
		return pool.Client{}, fmt.Errorf("%w: token is not for audience %q", leaseapi.ErrTokenInvalid, aud), true
	}
	u := tr.Status.User
	ns, sa, ok := serviceAccountOf(u.Username)
	if !ok {
		return pool.Client{}, fmt.Errorf("%w: %s is not a service account; only pod identities lease with a token", leaseapi.ErrTokenForbidden, u.Username), true
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, Groups: u.Groups, UID: u.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: LeaseVerb, Group: LeaseGroup, Resource: LeaseResource},
	}}
	if err := r.Client.Create(ctx, sar); err != nil {
		return pool.Client{}, fmt.Errorf("SubjectAccessReview: %w", err), false
	}
	if !sar.Status.Allowed {
		return pool.Client{}, fmt.Errorf("%w: service account %s/%s may not %s %s.%s in namespace %s (bind ClusterRole %s there)",
			leaseapi.ErrTokenForbidden, ns, sa, LeaseVerb, LeaseResource, LeaseGroup, ns, LeaseUserClusterRole), true
	}
	return pool.Client{Namespace: ns, ServiceAccount: sa}, nil, true
}

// serviceAccountOf splits system:serviceaccount:NAMESPACE:NAME.
func serviceAccountOf(username string) (ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(username, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	ns, name, ok = strings.Cut(rest, ":")
	return ns, name, ok && ns != "" && name != ""
}
