// Package pool holds the upstream members a gateway can lease: the lease
// store contract (LeaseStore) and its in-process Store (leases and
// cooldowns), member sources and through-the-member probes. The lease HTTP
// API (server and client) is pool/leaseapi, the shared Redis store
// pool/redisstore.
//
// It imports rotation, probe and internal/redact; never HTTP servers or
// clients of its own, Redis, gateway or controller.
package pool

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Member is one upstream a lease can hand out: an upstream proxy URL, or
// direct egress (URL nil), optionally bound to a local source address.
type Member struct {
	// Name is unique in a pool; it is what `proxy=` pins and what
	// X-Proxyfleet-Proxy reports.
	Name string
	// URL is the upstream proxy (http, https or socks5, with optional
	// credentials); nil for a direct member.
	URL *url.URL
	// SourceAddr binds direct egress to a local address; invalid (zero) lets the OS choose.
	SourceAddr netip.Addr
	// Attributes are what selectors match (region=eu, tier=dc).
	Attributes map[string]string
}

// Direct reports whether the member dials targets itself instead of chaining.
func (m Member) Direct() bool { return m.URL == nil }

// Redacted returns the member's URL without its secrets (redact.Parsed: the
// password, or a user name given without one), for logs and lists.
func (m Member) Redacted() string {
	if m.URL == nil {
		if m.SourceAddr.IsValid() {
			return "direct://" + m.SourceAddr.String()
		}
		return "direct://"
	}
	return redact.Parsed(m.URL)
}

// SameEndpoint reports whether m and o connect the same way: the same source
// address and proxy scheme, host and credentials (a changed password is a new
// upstream). The store, the prober and the gateway all judge a reload by it.
// It does not allocate; it runs on the gateway's request path.
func (m Member) SameEndpoint(o Member) bool {
	if m.SourceAddr != o.SourceAddr || (m.URL == nil) != (o.URL == nil) {
		return false
	}
	if m.URL == nil || m.URL == o.URL {
		return true
	}
	a, b := m.URL, o.URL
	if a.Scheme != b.Scheme || a.Host != b.Host || (a.User == nil) != (b.User == nil) {
		return false
	}
	if a.User == nil {
		return true
	}
	pa, _ := a.User.Password()
	pb, _ := b.User.Password()
	return a.User.Username() == b.User.Username() && pa == pb
}

// AcquireRequest asks for one member for one target.
type AcquireRequest struct {
	// Selector is attribute equality; every pair must match.
	Selector map[string]string
	// Proxy pins the lease to the member of that name (empty: any).
	Proxy string
	// Target is the site key (rotation.TargetKey); cooldowns are per {member, target}.
	Target string
	// TTL is the lease lifetime; zero means the store's default.
	TTL time.Duration
	// IdempotencyKey, when set, makes the acquire repeatable: a store that
	// already granted a lease for the key answers with that lease again
	// (while it is still reportable) instead of taking a second one. A
	// gateway retrying a lost controller replica sends the same key.
	IdempotencyKey string
}

// Lease is a member handed to one client for one target until ExpiresAt.
type Lease struct {
	ID        string
	Member    Member
	Target    string
	TTL       time.Duration
	ExpiresAt time.Time
	// FailureRest says the member rests for its own failures and was
	// leased anyway, because no member that does not could serve the
	// request (rotation.FailureRest's override). A holder that gets an
	// answer through it reports ok or answered, which ends the rest.
	FailureRest bool
}

// Report is feedback on a lease: a ban or failure starts a cooldown, ok resets
// the backoff.
type Report struct {
	Result rotation.Result
	// Target overrides the lease's target; empty falls back to the lease's
	// target, then to every target (report → lease → global: a client that omits
	// the target cannot poison the member for every site).
	Target string
	// RetryAfter is the site's own Retry-After, when it sent one.
	RetryAfter time.Duration
}

// Pool is what a gateway leases from: the in-process Store, or a Client of a
// remote lease API. Implementations are safe for concurrent use.
type Pool interface {
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Release is idempotent: releasing an unknown or expired lease is not an error.
	Release(ctx context.Context, leaseID string) error
	Report(ctx context.Context, leaseID string, r Report) error
}

// LaterReleaser is a Pool that can end a lease without the caller waiting
// for it: the shared Redis store sends the release with its next acquire
// (one round trip per acquire+release instead of two), or on its own a few
// milliseconds later, and keeps it while the store cannot be reached. The
// gateway releases a finished request's lease this way when its pool
// offers it; a caller that must know the release happened calls Release.
type LaterReleaser interface {
	ReleaseLater(leaseID string)
}

// ErrStoreUnavailable wraps a failure to reach the shared lease store (Redis
// down, failing over, loading its AOF). The lease API answers it with 503
// store_unavailable; it says nothing about the request itself.
var ErrStoreUnavailable = errors.New("lease store unavailable")

// DefaultRedisPrefix namespaces the Redis store's keys when no prefix is
// given. It is here, not in pool/redisstore, so the flags' defaults do not
// link the Redis client into a build that leaves the Redis store out.
const DefaultRedisPrefix = "proxyfleet"

// MaxRedisShards bounds the member groups of the Redis store
// (--lease-store-shards); here for the same reason as DefaultRedisPrefix.
const MaxRedisShards = 64

// APIBackend is what the lease API serves: a Pool plus the member view for
// GET /v1/proxies. *Store implements it; the controller feeds the same Store
// from its Proxy cache, so the server does not care where members come from.
type APIBackend interface {
	Pool
	// ListMembers lists every member with its health, leases and
	// cooldowns; an error wrapping ErrStoreUnavailable is a 503.
	ListMembers(ctx context.Context) ([]MemberStatus, error)
	// MaxTTL is the longest lease the backend grants; 0 means no limit.
	MaxTTL() time.Duration
}

// LeaseStore is a lease store a gateway or the controller runs on: the
// in-process *Store, or the shared *RedisStore. Members are fed in by a
// source (SetMembers, SetMembersHealth) and a prober (SetHealth); Start
// runs the store's background upkeep until its context ends.
type LeaseStore interface {
	APIBackend
	// SetMembers replaces the member set (see Store.SetMembers).
	SetMembers(members []Member)
	// SetMembersHealth replaces the member set with health verdicts in one step.
	SetMembersHealth(members []MemberHealth)
	// SetHealth records a probe verdict for one member.
	SetHealth(name string, healthy bool, latency time.Duration)
	// Members lists the current members (metrics, gateway reloads).
	Members() []MemberStatus
	// ActiveLeases counts unexpired, unreleased leases.
	ActiveLeases() int
	// ActiveCooldowns counts running cooldowns of current members.
	ActiveCooldowns() int
	// ListCooldowns lists the running cooldowns of current members with
	// why each runs (status pages).
	ListCooldowns(ctx context.Context) ([]Cooldown, error)
	// Start does the store's upkeep until ctx ends.
	Start(ctx context.Context)
}

// NoMatchError says why no member could be leased. The counts are additive:
// Considered = AtCapacity + InCooldown + Unhealthy + eligible-but-outranked.
type NoMatchError struct {
	Considered int `json:"considered"`
	AtCapacity int `json:"atCapacity"`
	InCooldown int `json:"inCooldown"`
	Unhealthy  int `json:"unhealthy"`
	// RetryAfterSeconds, when every member considered rests for the target,
	// is how long until the first of them may serve it again (rounded up);
	// 0 when that is not known (none considered, or one is unhealthy or at
	// capacity, which may end at any moment). A gateway answers it as the
	// 503's Retry-After, so a crawler does not ask every second for the
	// ten minutes of a ban.
	RetryAfterSeconds int64 `json:"retryAfterSeconds,omitempty"`
}

// SetRetryAfter sets RetryAfterSeconds from d, the time until the first
// cooldown of a judged member ends, when the counts say every member
// considered is cooling down (a store calls it once its counts are done).
func (e *NoMatchError) SetRetryAfter(d time.Duration) {
	e.RetryAfterSeconds = 0
	if e.Considered > 0 && e.InCooldown == e.Considered && d > 0 {
		e.RetryAfterSeconds = int64((d + time.Second - 1) / time.Second)
	}
}

// Add counts o's refusal in e: the refusal of a lease asked of several
// parts of the fleet in turn (a sharded store's groups, a tenant's
// namespaces) is their sum, and the first member back in any part is the
// first back.
func (e *NoMatchError) Add(o *NoMatchError) {
	e.Considered += o.Considered
	e.AtCapacity += o.AtCapacity
	e.InCooldown += o.InCooldown
	e.Unhealthy += o.Unhealthy
	if r := o.RetryAfterSeconds; r > 0 && (e.RetryAfterSeconds == 0 || r < e.RetryAfterSeconds) {
		e.RetryAfterSeconds = r
	}
}

func (e *NoMatchError) Error() string {
	return fmt.Sprintf("no usable upstream: %d considered, %d unhealthy, %d in cooldown, %d at capacity",
		e.Considered, e.Unhealthy, e.InCooldown, e.AtCapacity)
}

var (
	// ErrUnknownLease is a report on a lease that never existed or is past its report window.
	ErrUnknownLease = errors.New("unknown lease")
	// ErrTTLTooLong is a TTL above the store's maximum; a 400, never a silent clamp.
	ErrTTLTooLong = errors.New("ttl above maximum")
	// ErrUnreachable wraps a failure to reach a remote lease API.
	ErrUnreachable = errors.New("lease API unreachable")
	// ErrForbidden wraps a refusal of the caller's identity: a valid token
	// whose service account has no right to lease, or asks for members
	// their owner did not share with it (the lease API's 403, which a
	// client of a remote lease API gets back as this). Asking again
	// changes nothing until someone grants it.
	ErrForbidden = errors.New("not allowed to lease")
)

// Cooldown is one running cooldown: Member rests for Target (a site key;
// "" is every site) until Until.
type Cooldown struct {
	Member string
	Target string
	Until  time.Time
	// Reason is the report result that set the window's current end:
	// rate_limited, banned, target_unreachable (the member could not reach
	// that site) or upstream_failed (the member itself failed, every site).
	// Empty for a window written before stores kept reasons.
	Reason rotation.Result
}

// SortCooldowns orders cooldowns by target, then member: the site view.
func SortCooldowns(cs []Cooldown) {
	slices.SortFunc(cs, func(a, b Cooldown) int {
		if c := strings.Compare(a.Target, b.Target); c != 0 {
			return c
		}
		return strings.Compare(a.Member, b.Member)
	})
}

// MemberStatus is a member as the lease API lists it.
type MemberStatus struct {
	Member
	// Healthy is the probe verdict (always true when probing is off); a member
	// inside its upstream-failure window is still Healthy but InCooldown globally.
	Healthy bool
	// Latency is the last successful probe's round trip; zero when unknown.
	Latency time.Duration
	// ActiveLeases counts unexpired leases on the member.
	ActiveLeases int
	// Cooldowns lists the targets the member is cooling down for, with when
	// each ends; target "" means every target (an upstream failure or a report
	// without a target).
	Cooldowns map[string]time.Time
}
