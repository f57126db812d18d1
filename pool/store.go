package pool

import (
	"container/heap"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// Defaults of StoreOptions' zero values.
const (
	DefaultLeaseTTL         = 60 * time.Second
	DefaultMaxLeaseTTL      = time.Hour
	DefaultCooldown         = 10 * time.Minute
	DefaultMaxCooldown      = time.Hour
	DefaultFailureWindow    = 30 * time.Second
	DefaultSiteFailureRest  = 10 * time.Second
	DefaultSweepInterval    = 10 * time.Second
	DefaultReleasedRetained = 16384
)

var (
	// ErrInvalidTTL is a negative lease TTL.
	ErrInvalidTTL = errors.New("invalid ttl")
	// ErrInvalidResult is a report whose Result is not one of rotation's values.
	ErrInvalidResult = errors.New("invalid result")
)

// StoreOptions configures NewStore; every zero value means the default.
type StoreOptions struct {
	// Clock is the time source (tests inject a fake one); default time.Now.
	Clock func() time.Time
	// DefaultTTL is a lease's lifetime when the request says 0 (default 60s).
	DefaultTTL time.Duration
	// MaxTTL is the longest lease granted; above is ErrTTLTooLong (default 1h).
	MaxTTL time.Duration
	// Cooldown sizes the {member, target} windows after bans (default
	// {10m, 1h}). Cooldown.Max is also how long an ended lease still accepts
	// a report, and how long strikes are remembered after a window ends.
	Cooldown rotation.CooldownPolicy
	// FailureWindow is how long an upstream failure takes a member out for
	// every target (default 30s).
	FailureWindow time.Duration
	// SiteFailureRest is how long a {member, target} pair rests after the
	// member answered that it cannot reach the target (default 10s): short,
	// because the site is usually just as dead through every member, and
	// the member is fine for every other site.
	SiteFailureRest time.Duration
	// MaxLeasesPerMember caps unexpired leases per member; 0 is unlimited.
	MaxLeasesPerMember int
	// SweepInterval is how often Start drops ended leases and cooldowns
	// (default 10s). Only memory depends on it, never correctness.
	SweepInterval time.Duration
	// ReleasedRetained is how many released leases stay reportable (oldest
	// forgotten first), so a crawler can report a ban after the gateway let
	// go of the lease. 0 means 16384; negative means none.
	ReleasedRetained int
}

func (o StoreOptions) withDefaults() StoreOptions {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.DefaultTTL <= 0 {
		o.DefaultTTL = DefaultLeaseTTL
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = DefaultMaxLeaseTTL
	}
	if o.DefaultTTL > o.MaxTTL {
		o.DefaultTTL = o.MaxTTL
	}
	if o.Cooldown.Default <= 0 {
		o.Cooldown.Default = DefaultCooldown
	}
	if o.Cooldown.Max <= 0 {
		o.Cooldown.Max = max(DefaultMaxCooldown, o.Cooldown.Default)
	}
	if o.FailureWindow <= 0 {
		o.FailureWindow = DefaultFailureWindow
	}
	if o.SiteFailureRest <= 0 {
		o.SiteFailureRest = DefaultSiteFailureRest
	}
	if o.MaxLeasesPerMember < 0 {
		o.MaxLeasesPerMember = 0
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	if o.ReleasedRetained == 0 {
		o.ReleasedRetained = DefaultReleasedRetained
	}
	if o.ReleasedRetained < 0 {
		o.ReleasedRetained = 0
	}
	return o
}

// Store is the in-process lease store: members with their health, leases and
// {member, target} cooldowns, behind one mutex. It implements Pool and the
// lease API's backend. Every read checks expiry against the clock; the sweep
// in Start only frees memory.
type Store struct {
	o StoreOptions

	mu      sync.Mutex
	members map[string]*memberState
	order   []*memberState // current members sorted by name
	orphans map[*memberState]struct{}
	leases  map[string]*leaseEntry
	seq     uint64 // choice sequence; rotation.Candidate.LastChosen

	released     []string // ring of released lease IDs still reportable
	releasedNext int

	cands []rotation.Candidate // scratch for Acquire, guarded by mu
	picks []*memberState
}

type memberState struct {
	m          Member
	healthy    bool
	latency    time.Duration
	lastChosen uint64
	active     leaseHeap             // unexpired, unreleased leases by end
	cool       map[string]*coolState // by target; "" is every target
}

type coolState struct {
	until   time.Time
	strikes int // consecutive bans; reset by an ok report
}

type leaseEntry struct {
	lease    Lease
	ms       *memberState
	end      time.Time // ExpiresAt, or the release time if released earlier
	released bool
	idx      int // position in ms.active; -1 when not in it
}

// NewStore makes an empty store; add members with SetMembers.
func NewStore(o StoreOptions) *Store {
	o = o.withDefaults()
	return &Store{
		o:        o,
		members:  map[string]*memberState{},
		orphans:  map[*memberState]struct{}{},
		leases:   map[string]*leaseEntry{},
		released: make([]string, 0, min(o.ReleasedRetained, 1024)),
	}
}

// MaxTTL is the longest lease Acquire grants.
func (s *Store) MaxTTL() time.Duration { return s.o.MaxTTL }

// SetMembers replaces the member set (a reload). Kept members keep their
// health, latency, choice history and cooldowns unless their endpoint (URL or
// source address) changed, which makes them a new upstream. Removed members
// are never chosen again, but their leases stay releasable and reportable.
// Names should be unique (MergeMembers checks); a later duplicate is ignored.
// The store keeps its own copy of each member's attributes.
func (s *Store) SetMembers(members []Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setMembersLocked(members)
}

// MemberHealth is a member with its health verdict, for SetMembersHealth.
type MemberHealth struct {
	Member
	// Healthy is the verdict; only healthy members are leased.
	Healthy bool
	// Latency is the last successful probe's round trip; 0 is unknown.
	Latency time.Duration
}

// SetMembersHealth is SetMembers followed by SetHealth for every member,
// under one lock: a source that learns membership and health together (the
// controller's Proxy cache) never has a new unhealthy member leased in
// between, as SetMembers alone (new members start healthy) would allow.
// For duplicate names the first entry wins, as in SetMembers.
func (s *Store) SetMembersHealth(members []MemberHealth) {
	ms := make([]Member, len(members))
	for i, m := range members {
		ms[i] = m.Member
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setMembersLocked(ms)
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		if st := s.members[m.Name]; st != nil {
			st.healthy = m.Healthy
			st.latency = max(m.Latency, 0)
		}
	}
}

// setMembersLocked is SetMembers with s.mu held.
func (s *Store) setMembersLocked(members []Member) {
	next := make(map[string]*memberState, len(members))
	order := make([]*memberState, 0, len(members))
	for _, m := range members {
		if _, dup := next[m.Name]; dup {
			continue
		}
		m.Attributes = maps.Clone(m.Attributes)
		ms := s.members[m.Name]
		if ms == nil || !ms.m.SameEndpoint(m) {
			ms = &memberState{m: m, healthy: true, cool: map[string]*coolState{}}
		} else {
			ms.m = m
		}
		next[m.Name] = ms
		order = append(order, ms)
	}
	for name, ms := range s.members {
		if next[name] != ms && len(ms.active) > 0 {
			s.orphans[ms] = struct{}{}
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].m.Name < order[j].m.Name })
	s.members, s.order = next, order
}

// SetHealth records a probe verdict and the last successful probe's latency
// (0 = unknown). Unknown names are ignored: the member was removed meanwhile.
func (s *Store) SetHealth(name string, healthy bool, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ms := s.members[name]; ms != nil {
		ms.healthy = healthy
		ms.latency = max(latency, 0)
	}
}

// Acquire leases the best eligible member for req.Target (see rotation.Less).
// Per candidate the first matching reason disqualifies it: unhealthy, in
// cooldown (for the target or globally), at capacity. Selection and insertion
// happen under one lock. The returned Member shares its URL and Attributes
// with the store: treat them as read-only.
func (s *Store) Acquire(_ context.Context, req AcquireRequest) (Lease, error) {
	ttl := req.TTL
	switch {
	case ttl < 0:
		return Lease{}, fmt.Errorf("%w: %s must not be negative", ErrInvalidTTL, ttl)
	case ttl == 0:
		ttl = s.o.DefaultTTL
	case ttl > s.o.MaxTTL:
		return Lease{}, fmt.Errorf("%w: %s > %s", ErrTTLTooLong, ttl, s.o.MaxTTL)
	}
	id := rand.Text()

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	var nm NoMatchError
	cands, picks := s.cands[:0], s.picks[:0]
	consider := func(ms *memberState) {
		if !matchSelector(ms.m.Attributes, req.Selector) {
			return
		}
		nm.Considered++
		if !ms.healthy {
			nm.Unhealthy++
			return
		}
		if ms.cooling(req.Target, now) {
			nm.InCooldown++
			return
		}
		ms.prune(now)
		if s.o.MaxLeasesPerMember > 0 && len(ms.active) >= s.o.MaxLeasesPerMember {
			nm.AtCapacity++
			return
		}
		cands = append(cands, rotation.Candidate{
			Name: ms.m.Name, Active: len(ms.active), LastChosen: ms.lastChosen, Latency: ms.latency,
		})
		picks = append(picks, ms)
	}
	if req.Proxy != "" {
		if ms := s.members[req.Proxy]; ms != nil {
			consider(ms)
		}
	} else {
		for _, ms := range s.order {
			consider(ms)
		}
	}
	i := rotation.Pick(cands)
	var ms *memberState
	if i >= 0 {
		ms = picks[i]
	}
	clear(picks) // drop member pointers kept alive by the scratch slice
	s.cands, s.picks = cands[:0], picks[:0]
	if ms == nil {
		return Lease{}, &nm
	}
	for s.leases[id] != nil { // 128 random bits: never in practice
		id = rand.Text()
	}
	s.seq++
	ms.lastChosen = s.seq
	e := &leaseEntry{
		lease: Lease{ID: id, Member: ms.m, Target: req.Target, TTL: ttl, ExpiresAt: now.Add(ttl)},
		ms:    ms,
		end:   now.Add(ttl),
	}
	s.leases[id] = e
	heap.Push(&ms.active, e)
	return e.lease, nil
}

func matchSelector(attrs, sel map[string]string) bool {
	for k, want := range sel {
		if v, ok := attrs[k]; !ok || v != want {
			return false
		}
	}
	return true
}

// cooling reports whether the member rests for target, or for every target.
func (ms *memberState) cooling(target string, now time.Time) bool {
	if c := ms.cool[target]; c != nil && now.Before(c.until) {
		return true
	}
	if target != "" {
		if c := ms.cool[""]; c != nil && now.Before(c.until) {
			return true
		}
	}
	return false
}

// prune drops ended leases from the member's active set.
func (ms *memberState) prune(now time.Time) {
	for len(ms.active) > 0 && !now.Before(ms.active[0].end) {
		heap.Pop(&ms.active)
	}
}

// Release ends a lease early. It is idempotent and always nil: an unknown or
// already ended lease is fine. A released lease no longer counts as active,
// but stays reportable (see StoreOptions.ReleasedRetained) for the report
// window, so a crawler's late report still lands.
func (s *Store) Release(_ context.Context, leaseID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.leases[leaseID]
	if e == nil || e.released {
		return nil
	}
	e.released = true
	if e.idx >= 0 {
		heap.Remove(&e.ms.active, e.idx)
	}
	if now := s.o.Clock(); now.Before(e.end) {
		e.end = now
	}
	if s.o.ReleasedRetained == 0 {
		delete(s.leases, leaseID)
		return nil
	}
	if len(s.released) < s.o.ReleasedRetained {
		s.released = append(s.released, leaseID)
		return nil
	}
	old := s.released[s.releasedNext]
	if oe := s.leases[old]; oe != nil && oe.released {
		delete(s.leases, old)
	}
	s.released[s.releasedNext] = leaseID
	s.releasedNext = (s.releasedNext + 1) % len(s.released)
	return nil
}

// Report applies feedback on a lease. The target is r.Target, else the
// lease's target, else "" (every target).
//
//   - ok resets the ban strikes of {member, target} (a running window stays).
//   - rate_limited / banned cool {member, target} down for
//     Cooldown.Window(RetryAfter, strikes). Strikes count consecutive ban
//     episodes: a ban reported while the pair is already cooling down (other
//     in-flight requests hitting the same wall) extends the window if needed
//     but adds no strike; a ban after the window ended adds one; strikes are
//     forgotten Cooldown.Max after a window ends.
//   - upstream_failed cools the member down for every target for FailureWindow.
//
// A lease that ended (expired or released) less than Cooldown.Max ago still
// accepts reports; otherwise ErrUnknownLease. A negative RetryAfter counts as
// none. Report never ends the lease.
func (s *Store) Report(_ context.Context, leaseID string, r Report) error {
	if _, err := rotation.ParseResult(string(r.Result)); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidResult, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	e := s.leases[leaseID]
	if e == nil || !now.Before(e.end.Add(s.o.Cooldown.Max)) {
		return fmt.Errorf("%w %q", ErrUnknownLease, leaseID)
	}
	target := r.Target
	if target == "" {
		target = e.lease.Target
	}
	ms := e.ms
	switch {
	case r.Result == rotation.ResultOK:
		if c := ms.cool[target]; c != nil {
			c.strikes = 0
		}
	case r.Result.IsBan():
		c := ms.cool[target]
		if c == nil || !now.Before(c.until.Add(s.o.Cooldown.Max)) {
			c = &coolState{}
			ms.cool[target] = c
		}
		if !now.Before(c.until) || c.strikes == 0 {
			c.strikes++
		}
		if until := now.Add(s.o.Cooldown.Window(max(r.RetryAfter, 0), c.strikes)); until.After(c.until) {
			c.until = until
		}
	case r.Result == rotation.ResultTargetUnreachable:
		// A rest, not a ban: strikes (the ban backoff) stay as they are.
		c := ms.cool[target]
		if c == nil {
			c = &coolState{}
			ms.cool[target] = c
		}
		if until := now.Add(s.o.SiteFailureRest); until.After(c.until) {
			c.until = until
		}
	case r.Result == rotation.ResultUpstreamFailed:
		c := ms.cool[""]
		if c == nil {
			c = &coolState{}
			ms.cool[""] = c
		}
		if until := now.Add(s.o.FailureWindow); until.After(c.until) {
			c.until = until
		}
	}
	return nil
}

// Members lists the current members sorted by name, with health, active
// lease counts and running cooldowns (nil when none).
func (s *Store) Members() []MemberStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	out := make([]MemberStatus, 0, len(s.order))
	for _, ms := range s.order {
		ms.prune(now)
		st := MemberStatus{
			Member:       ms.m,
			Healthy:      ms.healthy,
			Latency:      ms.latency,
			ActiveLeases: len(ms.active),
		}
		st.Attributes = maps.Clone(ms.m.Attributes)
		for target, c := range ms.cool {
			if now.Before(c.until) {
				if st.Cooldowns == nil {
					st.Cooldowns = map[string]time.Time{}
				}
				st.Cooldowns[target] = c.until
			}
		}
		out = append(out, st)
	}
	return out
}

// ActiveLeases counts unexpired, unreleased leases, those on removed
// members included (a gauge read at scrape time).
func (s *Store) ActiveLeases() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	n := 0
	for _, ms := range s.order {
		ms.prune(now)
		n += len(ms.active)
	}
	for ms := range s.orphans {
		ms.prune(now)
		if len(ms.active) == 0 {
			delete(s.orphans, ms)
		}
		n += len(ms.active)
	}
	return n
}

// ActiveCooldowns counts running {member, target} cooldowns of current
// members, global ones included (a gauge read at scrape time).
func (s *Store) ActiveCooldowns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	n := 0
	for _, ms := range s.order {
		for _, c := range ms.cool {
			if now.Before(c.until) {
				n++
			}
		}
	}
	return n
}

// Start sweeps ended leases and forgotten cooldowns every SweepInterval until
// ctx ends. It only frees memory: reads never trust the sweep.
func (s *Store) Start(ctx context.Context) {
	t := time.NewTicker(s.o.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops leases past their report window, cooldown state past its
// memory, and orphaned members without leases.
func (s *Store) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock()
	keep := s.o.Cooldown.Max
	for id, e := range s.leases {
		if !now.Before(e.end.Add(keep)) {
			if e.idx >= 0 {
				heap.Remove(&e.ms.active, e.idx)
			}
			delete(s.leases, id)
		}
	}
	sweepState := func(ms *memberState) {
		ms.prune(now)
		for target, c := range ms.cool {
			if !now.Before(c.until.Add(keep)) {
				delete(ms.cool, target)
			}
		}
	}
	for _, ms := range s.order {
		sweepState(ms)
	}
	for ms := range s.orphans {
		sweepState(ms)
		if len(ms.active) == 0 {
			delete(s.orphans, ms)
		}
	}
}

// leaseHeap is a min-heap of leases by end, tracking each entry's index so a
// release can remove it in O(log n).
type leaseHeap []*leaseEntry

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].end.Before(h[j].end) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *leaseHeap) Push(x any) {
	e := x.(*leaseEntry)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *leaseHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.idx = -1
	*h = old[:len(old)-1]
	return e
}
