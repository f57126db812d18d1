// Package quota is the pure policy of a client's quotas: what it may take
// of the fleet per second (a rate over every site, a rate per site) and at
// once (concurrent leases). It decides from a state and a time and returns
// the state after; the lease stores keep the state (pool.Store in memory,
// pool/redisstore in one Lua script that does the same arithmetic), so a
// quota holds across every gateway on one store. No I/O, no clock of its
// own.
package quota

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Limits is what one client may take; a zero field is no limit.
type Limits struct {
	// Leases is how many leases the client may hold at once, every
	// gateway together.
	Leases int
	// RPS is its requests per second over every site.
	RPS float64
	// SiteRPS is its requests per second to any one site.
	SiteRPS float64
	// BytesPerDay is how many bytes its requests may carry (both ways,
	// bodies and tunnels) in one UTC day.
	BytesPerDay int64
}

// IsZero reports whether l limits nothing.
func (l Limits) IsZero() bool { return l == Limits{} }

// MaxRPS bounds a rate: above it a quota is no quota (and the interval in
// nanoseconds would round to nothing).
const MaxRPS = 1e6

// Check refuses a negative or non-finite limit, or one too large to mean
// anything, naming it as the operator wrote it.
func (l Limits) Check() error {
	switch {
	case l.Leases < 0:
		return fmt.Errorf("leases=%d is negative", l.Leases)
	case l.RPS < 0 || math.IsNaN(l.RPS) || l.RPS > MaxRPS:
		return fmt.Errorf("rps=%g: want 0 (no limit) to %g", l.RPS, float64(MaxRPS))
	case l.SiteRPS < 0 || math.IsNaN(l.SiteRPS) || l.SiteRPS > MaxRPS:
		return fmt.Errorf("site-rps=%g: want 0 (no limit) to %g", l.SiteRPS, float64(MaxRPS))
	case l.BytesPerDay < 0:
		return fmt.Errorf("bytes-per-day=%d is negative", l.BytesPerDay)
	}
	return nil
}

// Interval is the time one request of a rate of rps takes from its
// budget (0 for no rate).
func Interval(rps float64) time.Duration {
	if rps <= 0 {
		return 0
	}
	return max(time.Duration(float64(time.Second)/rps), 1)
}

// Burst is how far ahead of its steady pace a rate may run: one second's
// requests, at least one. A crawler that was idle may send a second's
// worth at once; over any longer span the rate holds (GCRA: at most
// rps×T + Burst(rps) requests in T).
func Burst(rps float64) int64 {
	return max(int64(math.Ceil(rps)), 1)
}

// Take is the generic cell rate algorithm for one request under a rate of
// one request per interval with a burst of burst requests: tat is the
// rate's theoretical arrival time (zero for a rate never used), now the
// store's clock. It returns the next tat and true when the request fits,
// or tat unchanged and the wait until it would fit.
func Take(tat, now time.Time, interval time.Duration, burst int64) (time.Time, bool, time.Duration) {
	t := tat
	if t.Before(now) {
		t = now
	}
	next := t.Add(interval)
	if over := next.Sub(now) - time.Duration(burst)*interval; over > 0 {
		return tat, false, over
	}
	return next, true, 0
}

// Which names the quota that refused a request, for the answer's reason
// message and metrics.
type Which string

// The quotas.
const (
	WhichRPS     Which = "rps"
	WhichSiteRPS Which = "site-rps"
	WhichLeases  Which = "leases"
	WhichBytes   Which = "bytes-per-day"
)

// Refusal is a request past a quota: which, the limit, and how long until
// the request would fit (the 429's Retry-After).
type Refusal struct {
	Which      Which
	Limit      float64
	RetryAfter time.Duration
}

// ErrExceeded is what a Refusal wraps: the gateway answers it 429.
var ErrExceeded = errors.New("quota exceeded")

// Error says which quota, its limit and when to come back.
func (r *Refusal) Error() string {
	return fmt.Sprintf("%s quota of %g exceeded; retry in %s", r.Which, r.Limit, r.RetryAfter.Round(time.Millisecond))
}

// Unwrap makes a Refusal ErrExceeded.
func (r *Refusal) Unwrap() error { return ErrExceeded }

// RetryAfterSeconds is r's wait in whole seconds, rounded up, at least 1
// (a Retry-After header).
func (r *Refusal) RetryAfterSeconds() int64 {
	return max(1, int64((r.RetryAfter+time.Second-1)/time.Second))
}

// TakeRates decides one request of a client to a site under l's two
// rates together: both must fit, and only then are both taken. tat and
// siteTat are the rates' states; it returns them after, and a refusal
// naming the rate that refused (the longer wait when both do).
func TakeRates(l Limits, tat, siteTat, now time.Time) (time.Time, time.Time, *Refusal) {
	nt, nst := tat, siteTat
	var ref *Refusal
	if l.RPS > 0 {
		var ok bool
		var wait time.Duration
		if nt, ok, wait = Take(tat, now, Interval(l.RPS), Burst(l.RPS)); !ok {
			ref = &Refusal{Which: WhichRPS, Limit: l.RPS, RetryAfter: wait}
		}
	}
	if l.SiteRPS > 0 {
		var ok bool
		var wait time.Duration
		if nst, ok, wait = Take(siteTat, now, Interval(l.SiteRPS), Burst(l.SiteRPS)); !ok && (ref == nil || wait > ref.RetryAfter) {
			ref = &Refusal{Which: WhichSiteRPS, Limit: l.SiteRPS, RetryAfter: wait}
		}
	}
	if ref != nil {
		return tat, siteTat, ref
	}
	return nt, nst, nil
}

// Day is the UTC day of t, as the stores key a client's bytes: days since
// the Unix epoch.
func Day(t time.Time) int64 { return t.Unix() / 86400 }

// TakeBytes decides one request of a client that has carried used bytes
// today (at now) under l: refused, until the UTC day ends, once used has
// reached the day's quota. The request that crosses it is not cut off: its
// size is known only once it has been carried.
func TakeBytes(l Limits, used int64, now time.Time) *Refusal {
	if l.BytesPerDay <= 0 || used < l.BytesPerDay {
		return nil
	}
	next := time.Unix((Day(now)+1)*86400, 0)
	return &Refusal{Which: WhichBytes, Limit: float64(l.BytesPerDay), RetryAfter: next.Sub(now)}
}

// LeaseRetry is the Retry-After of a refused lease: a lease ends with its
// request, or (a sticky session's) at its TTL, whichever the client does,
// so the store cannot know when a place frees; a second is how soon one
// usually does.
const LeaseRetry = time.Second

// TakeLease decides one more lease of a client that holds held leases
// now (unexpired ones only) under l.
func TakeLease(l Limits, held int) *Refusal {
	if l.Leases > 0 && held >= l.Leases {
		return &Refusal{Which: WhichLeases, Limit: float64(l.Leases), RetryAfter: LeaseRetry}
	}
	return nil
}
