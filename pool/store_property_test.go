package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// refStore is the reference the indexed selection is checked against: a
// straightforward model of which member Acquire must choose, by a linear
// scan in name order with the first-reason-disqualifies counting and
// rotation.Less, as the store did before it had an index.
//
// It models what selection depends on and the index keeps: membership and
// identity across reloads (a new endpoint is a new member), active leases
// (expiry, release, removed members' leases still live) and the choice
// sequence. Health, latency and running cooldowns it reads from
// Store.Members, which reports them straight from each member's state, so
// the reference does not repeat the cooldown policy that store_test.go
// already pins.
type refStore struct {
	maxPer  int
	members map[string]*refMember // current members
	gen     map[string]int        // identities handed out per name
	leases  map[string]*refLease
	seq     uint64
	reportW time.Duration // how long an ended lease accepts reports
	keep    int           // how many released leases stay reportable
	freed   []string      // released lease IDs, in order
}

// reportable reports whether the store still accepts a report on id.
func (r *refStore) reportable(id string, now time.Time) bool {
	l := r.leases[id]
	if !now.Before(l.end.Add(r.reportW)) {
		return false
	}
	return !l.released || slices.Contains(r.freed[max(0, len(r.freed)-r.keep):], id)
}

type refMember struct {
	name       string
	host       string // the endpoint: a new one is a new member
	gen        int
	attrs      map[string]string
	lastChosen uint64
}

type refLease struct {
	name     string
	gen      int
	end      time.Time
	released bool
	swept    bool // forgotten by a sweep: releasing it again changes nothing
}

func (r *refStore) setMembers(ms []Member) {
	next := map[string]*refMember{}
	for _, m := range ms {
		if next[m.Name] != nil {
			continue
		}
		cur := r.members[m.Name]
		if cur == nil || cur.host != m.URL.Host {
			r.gen[m.Name]++
			cur = &refMember{name: m.Name, host: m.URL.Host, gen: r.gen[m.Name]}
		}
		cur.attrs = m.Attributes
		next[m.Name] = cur
	}
	r.members = next
}

// identity is one member across reloads: a name and how many times it
// was (re)created.
type identity struct {
	name string
	gen  int
}

// active counts the unexpired, unreleased leases of each identity.
func (r *refStore) active(now time.Time) map[identity]int {
	n := map[identity]int{}
	for _, l := range r.leases {
		if !l.released && now.Before(l.end) {
			n[identity{l.name, l.gen}]++
		}
	}
	return n
}

func (r *refStore) totalActive(now time.Time) int {
	n := 0
	for _, l := range r.leases {
		if !l.released && now.Before(l.end) {
			n++
		}
	}
	return n
}

// choose is the reference selection: the best member by rotation.Less,
// else the override (a member resting only for its own failures), or the
// refusal's counts. snap is Store.Members at now; failed names the members
// whose cooldown for every target is a failure rest.
func (r *refStore) choose(req AcquireRequest, snap []MemberStatus, failed map[string]bool, now time.Time) (string, NoMatchError) {
	var nm NoMatchError
	var back time.Time // the first end of a considered member's cooldown
	best := -1
	var cands []rotation.Candidate
	active := r.active(now)
	for _, st := range snap {
		if req.Proxy != "" && st.Name != req.Proxy {
			continue
		}
		match := true
		for k, v := range req.Selector {
			if got, ok := st.Attributes[k]; !ok || got != v {
				match = false
			}
		}
		if !match {
			continue
		}
		nm.Considered++
		m := r.members[st.Name]
		act := active[identity{m.name, m.gen}]
		untilT, coolT := st.Cooldowns[req.Target]
		untilAll, coolAll := st.Cooldowns[""]
		switch {
		case !st.Healthy:
			nm.Unhealthy++
		case coolT || coolAll:
			nm.InCooldown++
			// It is back once both its cooldowns (this site's, every
			// site's) have ended.
			until := untilT
			if coolAll && (!coolT || untilAll.After(untilT)) {
				until = untilAll
			}
			if back.IsZero() || until.Before(back) {
				back = until
			}
		case r.maxPer > 0 && act >= r.maxPer:
			nm.AtCapacity++
		default:
			cands = append(cands, rotation.Candidate{Name: m.name, Active: act, LastChosen: m.lastChosen, Latency: st.Latency})
			if best < 0 || rotation.Less(cands[len(cands)-1], cands[best]) {
				best = len(cands) - 1
			}
		}
	}
	if best < 0 {
		if name := r.override(req, snap, failed, now); name != "" {
			return name, NoMatchError{}
		}
		if nm.Considered > 0 && nm.InCooldown == nm.Considered {
			nm.RetryAfterSeconds = int64((back.Sub(now) + time.Second - 1) / time.Second)
		}
		return "", nm
	}
	return cands[best].Name, NoMatchError{}
}

// override is the reference of rotation.FailureRest's override: among the
// members that are selected, healthy, not resting for the target and below
// capacity, but rest for their own failures, the least recently failed.
func (r *refStore) override(req AcquireRequest, snap []MemberStatus, failed map[string]bool, now time.Time) string {
	var best *rotation.Rested
	active := r.active(now)
	for _, st := range snap {
		if (req.Proxy != "" && st.Name != req.Proxy) || !st.Healthy || !failed[st.Name] {
			continue
		}
		match := true
		for k, v := range req.Selector {
			if got, ok := st.Attributes[k]; !ok || got != v {
				match = false
			}
		}
		m := r.members[st.Name]
		act := active[identity{m.name, m.gen}]
		if _, coolT := st.Cooldowns[req.Target]; !match || (req.Target != "" && coolT) || (r.maxPer > 0 && act >= r.maxPer) {
			continue
		}
		c := rotation.Rested{Candidate: rotation.Candidate{Name: m.name, Active: act, LastChosen: m.lastChosen, Latency: st.Latency}, Until: st.Cooldowns[""]}
		if best == nil || rotation.OverrideLess(c, *best) {
			best = &c
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}

// propertyWorld is one random pool: the names, attributes and endpoints a
// case draws from.
type propertyWorld struct {
	rng     *rand.Rand
	names   []string
	targets []string
}

func (w *propertyWorld) member(name string) Member {
	attrs := map[string]string{}
	regions := []string{"eu", "us", "ap"}
	attrs["region"] = regions[w.rng.IntN(len(regions))]
	if w.rng.IntN(3) > 0 {
		attrs["tier"] = []string{"dc", "res"}[w.rng.IntN(2)]
	}
	if w.rng.IntN(4) == 0 {
		attrs["zone"] = ""
	}
	host := fmt.Sprintf("10.0.0.%d:3128", w.rng.IntN(2)) // a reload may move a member
	return Member{Name: name, URL: &url.URL{Scheme: "http", Host: host}, Attributes: attrs}
}

func (w *propertyWorld) members() []Member {
	n := w.rng.IntN(len(w.names) + 1)
	var ms []Member
	for _, i := range w.rng.Perm(len(w.names))[:n] {
		ms = append(ms, w.member(w.names[i]))
	}
	if n > 0 && w.rng.IntN(5) == 0 { // a duplicate name: the first one wins
		ms = append(ms, w.member(ms[0].Name))
	}
	return ms
}

func (w *propertyWorld) selector() map[string]string {
	switch w.rng.IntN(8) {
	case 0, 1, 2:
		return nil
	case 3:
		return map[string]string{"region": []string{"eu", "us", "ap"}[w.rng.IntN(3)]}
	case 4:
		return map[string]string{"tier": []string{"dc", "res"}[w.rng.IntN(2)]}
	case 5:
		return map[string]string{"region": "eu", "tier": "dc"}
	case 6:
		return map[string]string{"zone": ""}
	}
	return map[string]string{"region": "nowhere"}
}

func (w *propertyWorld) target() string { return w.targets[w.rng.IntN(len(w.targets))] }

// TestStoreSelectionMatchesReference runs thousands of random sequences of
// every store operation (reloads with moved, removed, re-added and renamed
// attributes, health and latency changes, acquires with selectors, pins and
// targets, releases, reports of every result, clock steps past lease ends
// and cooldowns, sweeps) and checks after each acquire that the store chose
// exactly the member the reference chooses, or refused with exactly its
// counts, and that active lease counts agree. Seeds are fixed: a failure
// names the seed and step that reproduce it.
func TestStoreSelectionMatchesReference(t *testing.T) {
	const cases, steps = 3000, 120
	results := []rotation.Result{rotation.ResultOK, rotation.ResultRateLimited, rotation.ResultBanned, rotation.ResultUpstreamFailed, rotation.ResultTargetUnreachable, rotation.ResultAnswered}
	for seed := range uint64(cases) {
		rng := rand.New(rand.NewPCG(seed, 17))
		w := &propertyWorld{rng: rng, targets: []string{"", "a.com", "b.com", "c.com"}}
		size := 1 + rng.IntN(24)
		if seed%10 == 0 { // deeper heaps, where the pruned walk matters
			size = 100 + rng.IntN(200)
		}
		for i := range size {
			w.names = append(w.names, fmt.Sprintf("m%03d", i))
		}
		clk := newFakeClock()
		pol := rotation.CooldownPolicy{Default: 20 * time.Second, Max: 2 * time.Minute}
		retained := rng.IntN(3)
		o := StoreOptions{Clock: clk, Cooldown: pol, FailureWindow: 15 * time.Second, MaxLeasesPerMember: rng.IntN(4), ReleasedRetained: []int{-1, 3, 0}[retained]}
		s := NewStore(o)
		ref := &refStore{maxPer: o.MaxLeasesPerMember, gen: map[string]int{}, leases: map[string]*refLease{}, reportW: pol.Max, keep: []int{0, 3, DefaultReleasedRetained}[retained]}
		var ids []string
		var log []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d step %d: %s\nsteps:\n  %s", seed, len(log), fmt.Sprintf(format, args...), strings.Join(log[max(0, len(log)-12):], "\n  "))
		}
		ctx := context.Background()
		n := steps
		if size >= 100 {
			n = 4 * steps
		}
		for range n {
			now := clk.Now()
			switch op := rng.IntN(20); {
			case op == 0:
				ms := w.members()
				log = append(log, fmt.Sprintf("SetMembers(%d members)", len(ms)))
				s.SetMembers(ms)
				ref.setMembers(ms)
			case op == 1:
				ms := w.members()
				hs := make([]MemberHealth, len(ms))
				for i, m := range ms {
					hs[i] = MemberHealth{Member: m, Healthy: rng.IntN(4) > 0, Latency: time.Duration(rng.IntN(3)) * 5 * time.Millisecond}
				}
				log = append(log, fmt.Sprintf("SetMembersHealth(%d members)", len(ms)))
				s.SetMembersHealth(hs)
				ref.setMembers(ms)
			case op <= 3:
				name := w.names[rng.IntN(len(w.names))]
				healthy, lat := rng.IntN(3) > 0, time.Duration(rng.IntN(3))*5*time.Millisecond
				log = append(log, fmt.Sprintf("SetHealth(%s, %v, %v)", name, healthy, lat))
				s.SetHealth(name, healthy, lat)
			case op <= 5:
				d := time.Duration(rng.IntN(40)) * time.Second
				log = append(log, fmt.Sprintf("clock +%v", d))
				clk.Step(d)
			case op == 6:
				log = append(log, "sweep")
				s.sweep()
				for _, l := range ref.leases {
					l.swept = l.swept || !now.Before(l.end.Add(ref.reportW))
				}
			case op <= 8 && len(ids) > 0:
				id := ids[rng.IntN(len(ids))]
				log = append(log, "Release "+id[:6])
				if err := s.Release(ctx, id); err != nil {
					fail("Release: %v", err)
				}
				if l := ref.leases[id]; !l.released && !l.swept {
					l.released = true
					ref.freed = append(ref.freed, id)
					if now.Before(l.end) {
						l.end = now
					}
				}
			case op <= 11 && len(ids) > 0:
				id := ids[rng.IntN(len(ids))]
				r := Report{Result: results[rng.IntN(len(results))], RetryAfter: time.Duration(rng.IntN(3)-1) * 10 * time.Second}
				if rng.IntN(2) == 0 {
					r.Target = w.target()
				}
				log = append(log, fmt.Sprintf("Report %s %+v", id[:6], r))
				err := s.Report(ctx, id, r)
				if want := ref.reportable(id, now); want == errors.Is(err, ErrUnknownLease) || (want && err != nil) {
					fail("Report = %v, reference says reportable = %v", err, want)
				}
			default:
				req := AcquireRequest{Selector: w.selector(), Target: w.target(), TTL: time.Duration(1+rng.IntN(90)) * time.Second}
				if rng.IntN(8) == 0 {
					req.Proxy = fmt.Sprintf("m%03d", rng.IntN(len(w.names)+1))
				}
				log = append(log, fmt.Sprintf("Acquire %+v", req))
				// The cooldowns as they were before the acquire: it changes
				// none of them.
				cds, _ := s.ListCooldowns(ctx)
				failed := map[string]bool{}
				for _, cd := range cds {
					if cd.Target == "" && cd.Reason == rotation.ResultUpstreamFailed {
						failed[cd.Member] = true
					}
				}
				l, err := s.Acquire(ctx, req)
				snap := s.Members()
				wantName, wantNM := ref.choose(req, snap, failed, now)
				var nm *NoMatchError
				switch {
				case wantName == "" && !errors.As(err, &nm):
					fail("Acquire = %v, %v; want NoMatchError %+v", l.Member.Name, err, wantNM)
				case wantName == "" && *nm != wantNM:
					fail("NoMatchError = %+v, want %+v", *nm, wantNM)
				case wantName != "" && err != nil:
					fail("Acquire: %v, want %s", err, wantName)
				case wantName != "" && l.Member.Name != wantName:
					fail("Acquire chose %s, reference chose %s", l.Member.Name, wantName)
				}
				if err == nil {
					m := ref.members[wantName]
					ref.seq++
					m.lastChosen = ref.seq
					ref.leases[l.ID] = &refLease{name: m.name, gen: m.gen, end: l.ExpiresAt}
					ids = append(ids, l.ID)
				}
				var names []string
				active := ref.active(now)
				for _, st := range snap {
					names = append(names, st.Name)
					if m := ref.members[st.Name]; st.ActiveLeases != active[identity{m.name, m.gen}] {
						fail("%s has %d active leases, reference %d", st.Name, st.ActiveLeases, active[identity{m.name, m.gen}])
					}
				}
				if want := slices.Sorted(func(yield func(string) bool) {
					for n := range ref.members {
						if !yield(n) {
							return
						}
					}
				}); !slices.Equal(names, want) {
					fail("Members = %v, reference %v", names, want)
				}
				// Only after the acquire: reads apply expiry, which must not
				// hide an acquire that forgot to.
				if got, want := s.ActiveLeases(), ref.totalActive(now); got != want {
					fail("ActiveLeases = %d, reference %d", got, want)
				}
			}
		}
	}
}
