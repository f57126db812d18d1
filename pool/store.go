package pool

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"k8s.io/utils/clock"
	"maps"
	"slices"
	"strings"
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
	// ErrUnknownMember is a ReportMember for a member the store does not have.
	ErrUnknownMember = errors.New("unknown member")
)

// StoreOptions configures NewStore; every zero value means the default.
type StoreOptions struct {
	// Clock is the time source (tests inject a fake one, k8s.io/utils/clock's
	// testing.FakeClock); default the real clock.
	Clock clock.PassiveClock
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
	// FailureRest bounds how much of the pool rests for its own failures at
	// once and when such a member is leased anyway (rotation.FailureRest;
	// the zero value is its default, 50%).
	FailureRest rotation.FailureRest
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
	// go of the lease. 0 means 16384; negative means none. A Redis store
	// keeps this many per member group.
	ReleasedRetained int
}

// WithDefaults fills in the zero fields with the defaults (every lease store
// applies the same ones).
func (o StoreOptions) WithDefaults() StoreOptions {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
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
// lease API's backend. Every operation first applies what the clock ended
// (lease expiry, global cooldowns) in order of time, so no read trusts the
// sweep in Start, which only frees memory.
//
// Acquire costs O(log n) in the pool size: the members that can be chosen
// are kept in a selectionIndex ordered by rotation.Less (see index.go and
// docs/architecture.md); only a refusal (NoMatchError, whose counts are
// exact) scans the members.
type Store struct {
	o     StoreOptions
	pace  *Paces     // the sites' pace (SitePacer), on the store's clock
	tiers *SiteTiers // the sites' places on the tiers (SiteTierKeeper), likewise
	// quotas are the clients' quotas (QuotaKeeper), on the store's clock.
	quotas *Quotas

	mu      sync.Mutex
	members map[string]*memberState
	order   []*memberState // current members sorted by name
	idx     *selectionIndex
	resting restHeap // members out of idx until their cooldown for every target ends
	// The leases, live and still reportable (see store_leases.go).
	base     time.Time // the time base of leaseEntry.end
	slab     leaseSlab
	live     leaseHeap // every unexpired, unreleased lease by end, removed members' too
	targets  targetTable
	idem     map[string]idemLease // by AcquireRequest.IdempotencyKey
	idemKeys map[uint32]string    // the key of each slot in idem
	seq      uint64               // choice sequence; rotation.Candidate.LastChosen

	released     []releasedRef // ring of released leases still reportable
	releasedNext int
}

type memberState struct {
	m Member
	// key is what selection orders by: Name, Active (unexpired, unreleased
	// leases), LastChosen and Latency. Change it only through Store methods
	// that tell the index (rekeyed).
	key     rotation.Candidate
	healthy bool
	cool    map[string]*coolState // by target; "" is every target
	current bool                  // a member now (in Store.members), not removed or replaced
	resting bool                  // has an entry in Store.resting
	nodes   []*heapNode           // its places in the index; empty when not indexed
}

func newMemberState(m Member) *memberState {
	return &memberState{m: m, key: rotation.Candidate{Name: m.Name}, healthy: true, cool: map[string]*coolState{}}
}

// indexed reports whether ms is in the selection index.
func (ms *memberState) indexed() bool { return len(ms.nodes) > 0 }

type coolState struct {
	until   time.Time
	strikes int             // consecutive bans; reset by an ok report
	reason  rotation.Result // the report that set until
}

// NewStore makes an empty store; add members with SetMembers.
func NewStore(o StoreOptions) *Store {
	o = o.WithDefaults()
	s := &Store{
		o:        o,
		pace:     NewPaces(o.Clock),
		tiers:    NewSiteTiers(o.Clock),
		quotas:   NewQuotas(o.Clock),
		members:  map[string]*memberState{},
		idx:      newSelectionIndex(),
		base:     o.Clock.Now(),
		targets:  targetTable{index: map[string]uint32{}},
		idem:     map[string]idemLease{},
		idemKeys: map[uint32]string{},
		released: make([]releasedRef, 0, min(o.ReleasedRetained, 1024)),
	}
	s.live.slab = &s.slab
	return s
}

// MaxTTL is the longest lease Acquire grants.
func (s *Store) MaxTTL() time.Duration { return s.o.MaxTTL }

// SetMembers replaces the member set (a reload). Kept members keep their
// health, latency, choice history and cooldowns unless their endpoint (URL or
// source address) changed, which makes them a new upstream. Removed members
// are never chosen again, but their leases stay releasable and reportable.
// Names should be unique (MergeMembers checks); a later duplicate is ignored.
// The store keeps its own copy of each member's attributes. Its cost is
// linear in the list (a map and a sort by name), plus O(log n) per member
// that is added, removed or changed.
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
	now := s.o.Clock.Now()
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		if st := s.members[m.Name]; st != nil {
			s.setHealthLocked(st, m.Healthy, m.Latency, now)
		}
	}
}

// setMembersLocked is SetMembers with s.mu held. Members that keep their
// endpoint and attributes stay where they are in the index; only added,
// removed and changed members are moved in or out of it.
func (s *Store) setMembersLocked(members []Member) {
	now := s.o.Clock.Now()
	s.advance(now)
	next := make(map[string]*memberState, len(members))
	order := make([]*memberState, 0, len(members))
	var enter []*memberState // new members and kept ones with new attributes
	for _, m := range members {
		if _, dup := next[m.Name]; dup {
			continue
		}
		ms := s.members[m.Name]
		switch {
		case ms == nil || !ms.m.SameEndpoint(m):
			m.Attributes = maps.Clone(m.Attributes)
			ms = newMemberState(m)
			enter = append(enter, ms)
		case !maps.Equal(ms.m.Attributes, m.Attributes):
			s.idx.drop(ms)
			s.idx.count(ms, -1)
			ms.current = false
			m.Attributes = maps.Clone(m.Attributes)
			ms.m = m
			enter = append(enter, ms)
		default:
			m.Attributes = ms.m.Attributes // equal: keep the store's own copy
			ms.m = m
		}
		next[m.Name] = ms
		order = append(order, ms)
	}
	for name, ms := range s.members {
		if next[name] != ms && ms.current {
			s.idx.drop(ms)
			s.idx.count(ms, -1)
			ms.current = false
		}
	}
	for _, ms := range enter {
		ms.current = true
		s.idx.count(ms, 1)
		s.place(ms, now)
	}
	slices.SortFunc(order, func(a, b *memberState) int { return strings.Compare(a.m.Name, b.m.Name) })
	s.members, s.order = next, order
}

// SetHealth records a probe verdict and the last successful probe's latency
// (0 = unknown). Unknown names are ignored: the member was removed meanwhile.
func (s *Store) SetHealth(name string, healthy bool, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ms := s.members[name]; ms != nil {
		s.setHealthLocked(ms, healthy, latency, s.o.Clock.Now())
	}
}

// setHealthLocked is SetHealth on one current member with s.mu held.
func (s *Store) setHealthLocked(ms *memberState, healthy bool, latency time.Duration, now time.Time) {
	if latency = max(latency, 0); latency != ms.key.Latency {
		ms.key.Latency = latency
		s.idx.rekeyed(ms)
	}
	if healthy != ms.healthy {
		ms.healthy = healthy
		s.idx.drop(ms)
		s.place(ms, now)
	}
}

// place puts ms where its state says: in the index when it can be chosen
// for some target; in s.resting while it cools down for every target (an
// upstream failure can take out much of a fleet at once, and Acquire should
// not walk past all of it); nowhere when unhealthy or no longer current.
// An indexed member is left alone.
func (s *Store) place(ms *memberState, now time.Time) {
	if ms.indexed() || !ms.current || !ms.healthy {
		return
	}
	if c := ms.cool[""]; c != nil && now.Before(c.until) {
		if !ms.resting {
			ms.resting = true
			heap.Push(&s.resting, restEntry{ms: ms, until: c.until})
		}
		return
	}
	s.idx.add(ms)
}

// advance applies what ended by now, in order of time: expired leases stop
// counting as active, and members whose cooldown for every target ended
// return to the index. Every operation that reads selection state calls it
// first; its cost is O(log n) per event, paid once.
func (s *Store) advance(now time.Time) {
	for t := s.rel(now); len(s.live.slots) > 0; {
		e := s.slab.at(s.live.slots[0])
		if t < e.end {
			break
		}
		s.live.remove(0)
		e.ms.key.Active--
		s.idx.rekeyed(e.ms)
	}
	for len(s.resting) > 0 && !now.Before(s.resting[0].until) {
		ms := heap.Pop(&s.resting).(restEntry).ms
		ms.resting = false
		s.place(ms, now) // back to resting if the cooldown was extended
	}
}

// Acquire leases the best eligible member for req.Target (see rotation.Less).
// Per candidate the first matching reason disqualifies it: unhealthy, in
// cooldown (for the target or globally), at capacity (see judge). Selection
// and insertion happen under one lock. It costs O(log n) in the pool size
// plus the members that rank above the chosen one and are passed over (in
// cooldown for this target, or outside a multi-pair selector); a refusal
// scans every member to count why. The returned Member shares its URL and
// Attributes with the store: treat them as read-only.
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
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand)
	nonce := [2]uint64{binary.BigEndian.Uint64(raw[:8]), binary.BigEndian.Uint64(raw[8:])}

	s.mu.Lock()
	defer s.mu.Unlock()
	// A retry gets the first answer again, unless that lease's member was
	// removed or replaced meanwhile (fencing): such a lease counts for
	// nothing and its reports are ignored, so the retry takes a fresh one.
	if il, ok := s.idem[req.IdempotencyKey]; req.IdempotencyKey != "" && ok {
		if _, e := s.lookup(il.lease.ID); e != nil && e.ms.current {
			return il.lease, nil
		}
	}
	now := s.o.Clock.Now()
	s.advance(now)
	// Every member judged is counted, so that a refusal's counts cost no
	// second pass over the index: when the walk finds nobody it has judged
	// every indexed member the selector can match (see memberHeap.best).
	var nm NoMatchError
	var back time.Time // the first end of a judged member's cooldown
	eligible := func(ms *memberState) bool {
		v := s.judge(ms, req, now, &back)
		nm.add(v)
		return v == verdictEligible
	}
	var ms *memberState
	if req.Proxy != "" {
		if p := s.members[req.Proxy]; p != nil && eligible(p) {
			ms = p
		}
	} else {
		ms = s.idx.best(req.Selector, eligible)
	}
	if ms == nil {
		if ms = s.override(req, now); ms != nil {
			s.seq++
			ms.key.LastChosen = s.seq
			ms.key.Active++
			return s.grant(ms, nonce, req, ttl, now, true), nil
		}
		if req.Proxy == "" && s.idx.carries(req.Selector) {
			s.countUnindexed(&nm, req, now, &back)
		}
		refused := nm
		refused.SetRetryAfter(back.Sub(now))
		return Lease{}, &refused
	}
	s.seq++
	ms.key.LastChosen = s.seq
	ms.key.Active++
	s.idx.rekeyed(ms)
	return s.grant(ms, nonce, req, ttl, now, false), nil
}

// grant records a lease of ms for req: a slot in the slab (whose number
// the ID carries, so the slot is the ID's and no map is needed), a place
// in the expiry heap, the target interned. override marks a lease of a
// member resting for its own failures (Store.override).
func (s *Store) grant(ms *memberState, nonce [2]uint64, req AcquireRequest, ttl time.Duration, now time.Time, override bool) Lease {
	slot := s.slab.alloc()
	e := s.slab.at(slot)
	*e = leaseEntry{nonce: nonce, ms: ms, end: addSat(s.rel(now), ttl), bits: s.targets.ref(req.Target)}
	s.live.push(slot)
	l := Lease{ID: leaseID(nonce, slot), Member: ms.m, Target: req.Target, TTL: ttl, ExpiresAt: now.Add(ttl), FailureRest: override}
	if req.IdempotencyKey != "" {
		e.bits |= leaseIdem
		s.idem[req.IdempotencyKey] = idemLease{slot: slot, lease: l}
		s.idemKeys[slot] = req.IdempotencyKey
	}
	return l
}

// verdict is why a member can or cannot take a lease request.
type verdict int

const (
	verdictEligible verdict = iota
	verdictNotSelected
	verdictUnhealthy
	verdictInCooldown
	verdictAtCapacity
)

// judge is the one definition of who may take req: the first matching reason
// disqualifies (the NoMatchError counts depend on that order). It expects
// s.advance(now) to have run.
//
// A member in cooldown moves *back to its cooldown's end when that is
// earlier (or *back is zero): what a refusal's RetryAfterSeconds reads.
func (s *Store) judge(ms *memberState, req AcquireRequest, now time.Time, back *time.Time) verdict {
	switch {
	case !MatchSelector(ms.m.Attributes, req.Selector):
		return verdictNotSelected
	case !ms.healthy:
		return verdictUnhealthy
	}
	if until := ms.coolingUntil(req.Target, now); !until.IsZero() {
		if back.IsZero() || until.Before(*back) {
			*back = until
		}
		return verdictInCooldown
	}
	if s.o.MaxLeasesPerMember > 0 && ms.key.Active >= s.o.MaxLeasesPerMember {
		return verdictAtCapacity
	}
	return verdictEligible
}

// add counts a member that judge gave v.
func (nm *NoMatchError) add(v verdict) {
	if v == verdictNotSelected {
		return
	}
	nm.Considered++
	switch v {
	case verdictUnhealthy:
		nm.Unhealthy++
	case verdictInCooldown:
		nm.InCooldown++
	case verdictAtCapacity:
		nm.AtCapacity++
	}
}

// countUnindexed adds to a refusal's counts the current members outside the
// index (unhealthy, or cooling down for every target), which the walk did
// not see. It runs only on a refusal and is the one scan of every member
// left in Acquire.
func (s *Store) countUnindexed(nm *NoMatchError, req AcquireRequest, now time.Time, back *time.Time) {
	for _, ms := range s.order {
		if !ms.indexed() {
			nm.add(s.judge(ms, req, now, back))
		}
	}
}

// MatchSelector reports whether a member with attrs is one sel asks for:
// every key of sel present with the same value (an empty selector matches
// every member). The one reading of a selector in Go; the lease API's list
// and the tenant store's refusal call it so a list, a lease and a 403
// agree on which members a selector names.
func MatchSelector(attrs, sel map[string]string) bool {
	for k, want := range sel {
		if v, ok := attrs[k]; !ok || v != want {
			return false
		}
	}
	return true
}

// coolingUntil is when the member may serve target again, zero when it
// does not rest for it: the later end of its cooldown for target and for
// every target.
func (ms *memberState) coolingUntil(target string, now time.Time) time.Time {
	var until time.Time
	c := ms.cool[target]
	if c != nil && now.Before(c.until) {
		until = c.until
	}
	// A member whose one cooldown is target's has none for every target:
	// no second lookup (a refusal judges every member this way).
	if target != "" && (c == nil || len(ms.cool) > 1) {
		if a := ms.cool[""]; a != nil && now.Before(a.until) && a.until.After(until) {
			until = a.until
		}
	}
	return until
}

// Release ends a lease early. It is idempotent and always nil: an unknown or
// already ended lease is fine. A released lease no longer counts as active,
// but stays reportable (see StoreOptions.ReleasedRetained) for the report
// window, so a crawler's late report still lands.
func (s *Store) Release(_ context.Context, leaseID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, e := s.lookup(leaseID)
	if e == nil || e.released() {
		return nil
	}
	e.bits |= leaseReleased
	if e.pos >= 0 {
		s.live.remove(int(e.pos))
		e.ms.key.Active--
		s.idx.rekeyed(e.ms)
	}
	e.end = min(e.end, s.rel(s.o.Clock.Now()))
	if s.o.ReleasedRetained == 0 {
		s.forget(slot)
		return nil
	}
	ref := releasedRef{nonce: e.nonce, slot: slot}
	if len(s.released) < s.o.ReleasedRetained {
		s.released = append(s.released, ref)
		return nil
	}
	old := s.released[s.releasedNext]
	if oe := s.slab.lookup(old.slot, old.nonce); oe != nil && oe.released() {
		s.forget(old.slot)
	}
	s.released[s.releasedNext] = ref
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
	now := s.o.Clock.Now()
	_, e := s.lookup(leaseID)
	if e == nil || s.rel(now) >= addSat(e.end, s.o.Cooldown.Max) {
		return fmt.Errorf("%w %q", ErrUnknownLease, leaseID)
	}
	target := r.Target
	if target == "" {
		target = s.targets.names[e.target()]
	}
	s.reportLocked(e.ms, target, r, now)
	return nil
}

// ReportMember applies a report to the member of that name, as Report does
// to a lease's member, for target ("" is every target). It is for feedback
// that arrives without a lease of this store: a --lease-api gateway serving
// from its last-known members (pool/lastknown) learns of bans on leases the
// lease API granted. An unknown or removed member is ErrUnknownMember.
func (s *Store) ReportMember(name, target string, r Report) error {
	if _, err := rotation.ParseResult(string(r.Result)); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidResult, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := s.members[name]
	if ms == nil {
		return fmt.Errorf("%w %q", ErrUnknownMember, name)
	}
	now := s.o.Clock.Now()
	s.advance(now)
	s.reportLocked(ms, target, r, now)
	return nil
}

// MergeCooldowns extends the cooldowns of current members to the given
// ends: the longer window wins, a shorter one changes nothing, strikes stay
// as they are, and cooldowns of members the store does not have are
// ignored. It is how cooldowns learnt elsewhere (the lease API's list, a
// gateway back from an outage) join the store's own without either side's
// being cut short.
func (s *Store) MergeCooldowns(cs []Cooldown) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock.Now()
	s.advance(now)
	for _, cd := range cs {
		ms := s.members[cd.Member]
		if ms == nil || !now.Before(cd.Until) {
			continue
		}
		c := ms.cool[cd.Target]
		if c == nil {
			c = &coolState{}
			ms.cool[cd.Target] = c
		}
		s.coolUntil(ms, cd.Target, c, cd.Until, now, cd.Reason)
	}
}

// reportLocked is Report's effect on ms for target, with s.mu held.
func (s *Store) reportLocked(ms *memberState, target string, r Report, now time.Time) {
	switch {
	case r.Result == rotation.ResultOK:
		if c := ms.cool[target]; c != nil {
			c.strikes = 0
		}
		s.endFailureRest(ms, now)
	case r.Result == rotation.ResultAnswered:
		s.endFailureRest(ms, now)
	case r.Result.IsBan():
		c := ms.cool[target]
		if c == nil || !now.Before(c.until.Add(s.o.Cooldown.Max)) {
			c = &coolState{}
			ms.cool[target] = c
		}
		if !now.Before(c.until) || c.strikes == 0 {
			c.strikes++
		}
		s.coolUntil(ms, target, c, now.Add(s.o.Cooldown.Window(max(r.RetryAfter, 0), c.strikes)), now, r.Result)
	case r.Result == rotation.ResultTargetUnreachable:
		// A rest, not a ban: strikes (the ban backoff) stay as they are.
		c := ms.cool[target]
		if c == nil {
			c = &coolState{}
			ms.cool[target] = c
		}
		s.coolUntil(ms, target, c, now.Add(s.o.SiteFailureRest), now, r.Result)
	case r.Result == rotation.ResultUpstreamFailed:
		c := ms.cool[""]
		if c == nil {
			c = &coolState{}
			ms.cool[""] = c
		}
		why := r.Result
		switch {
		case now.Before(c.until) && c.reason != rotation.ResultUpstreamFailed:
			// A ban or site rest for every target runs: the failure may
			// lengthen it but does not make it a failure rest, which an
			// answer would end.
			why = c.reason
		case !ms.failureResting(now):
			s.admitFailureRest(ms, now)
		}
		s.coolUntil(ms, "", c, now.Add(s.o.FailureWindow), now, why)
	}
}

// coolUntil extends c, the cooldown of ms for target, to until if that is
// later. A cooldown for every target ("") also takes ms out of the
// selection index until it ends (see place); Acquire would skip it anyway,
// so this only saves walking past it.
func (s *Store) coolUntil(ms *memberState, target string, c *coolState, until, now time.Time, why rotation.Result) {
	if !until.After(c.until) {
		return
	}
	c.until, c.reason = until, why
	if target == "" {
		s.idx.drop(ms)
		s.place(ms, now)
	}
}

// Members lists the current members sorted by name, with health, active
// lease counts and running cooldowns (nil when none).
func (s *Store) Members() []MemberStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock.Now()
	s.advance(now)
	out := make([]MemberStatus, 0, len(s.order))
	for _, ms := range s.order {
		st := MemberStatus{
			Member:       ms.m,
			Healthy:      ms.healthy,
			Latency:      ms.key.Latency,
			ActiveLeases: ms.key.Active,
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
	s.advance(s.o.Clock.Now())
	return len(s.live.slots)
}

// ActiveCooldowns counts running {member, target} cooldowns of current
// members, global ones included (a gauge read at scrape time).
func (s *Store) ActiveCooldowns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock.Now()
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

// ListCooldowns lists the running cooldowns of current members, sorted by
// target then member (SortCooldowns). It never fails.
func (s *Store) ListCooldowns(context.Context) ([]Cooldown, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock.Now()
	var out []Cooldown
	for _, ms := range s.order {
		for target, c := range ms.cool {
			if now.Before(c.until) {
				out = append(out, Cooldown{Member: ms.m.Name, Target: target, Until: c.until, Reason: c.reason})
			}
		}
	}
	SortCooldowns(out)
	return out, nil
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

// sweep drops leases past their report window and cooldown state past its
// memory. A removed member's state goes with its last lease.
func (s *Store) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Clock.Now()
	s.advance(now)
	keep := s.o.Cooldown.Max
	t := s.rel(now)
	for slot := range s.slab.hw {
		if e := s.slab.at(slot); e.ms != nil && t >= addSat(e.end, keep) { // ended, so no longer in s.live
			s.forget(slot)
		}
	}
	s.slab.shrink()
	s.live.shrink()
	s.targets.shrink()
	for _, ms := range s.order {
		for target, c := range ms.cool {
			if !now.Before(c.until.Add(keep)) {
				delete(ms.cool, target)
			}
		}
	}
}

// forget drops the ended lease in slot and its idempotency key.
func (s *Store) forget(slot uint32) {
	e := s.slab.at(slot)
	if e.bits&leaseIdem != 0 {
		key := s.idemKeys[slot]
		delete(s.idemKeys, slot)
		if il, ok := s.idem[key]; ok && il.slot == slot {
			delete(s.idem, key)
		}
	}
	s.targets.unref(e.target())
	*e = leaseEntry{}
	s.slab.put(slot)
}

// ListMembers is Members for the lease API; the in-memory store never fails.
func (s *Store) ListMembers(context.Context) ([]MemberStatus, error) { return s.Members(), nil }

// restEntry is a member cooling down for every target until until (the
// cooldown's end when it entered Store.resting; place re-checks it).
type restEntry struct {
	ms    *memberState
	until time.Time
}

// restHeap is a min-heap of resting members by until.
type restHeap []restEntry

func (h restHeap) Len() int           { return len(h) }
func (h restHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h restHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *restHeap) Push(x any)        { *h = append(*h, x.(restEntry)) }
func (h *restHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = restEntry{}
	*h = old[:len(old)-1]
	return e
}
