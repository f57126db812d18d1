package rotation

import (
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of NewMemberEvidence's zero arguments.
const (
	// DefaultEvidenceSites is how many distinct sites a member must fail,
	// while other members reach them, before it counts as broken. One or
	// two such sites are what an IP-range block by a site looks like.
	DefaultEvidenceSites = 3
	// DefaultEvidenceWindow is how far back those failures count.
	DefaultEvidenceWindow = time.Minute
	// maxEvidenceMembers bounds the members with a record; when full the
	// record starts over, which only delays a verdict.
	maxEvidenceMembers = 4096
)

// MemberEvidence tells a broken member from dead sites. An upstream's
// answer about a site is about the site (FaultSite), so one member failing
// one site never takes it out. But a member that fails Sites distinct
// sites within Window, each of which another member reached right after,
// and that carried nothing successfully in between, is broken for
// everyone: only then does its site-level answer become member-wide.
//
// A success through the member clears its record: a member that serves
// other sites and fails a few is banned by those few (an IP-range block),
// which their {member, site} rests already handle.
//
// It is pure bookkeeping (the caller passes the clock) and safe for
// concurrent use. Reached, called on every success, costs one atomic load
// while no member has a record.
type MemberEvidence struct {
	sites  int
	window time.Duration

	n  atomic.Int64 // len(m), readable without mu
	mu sync.Mutex
	m  map[string][]siteAt
}

type siteAt struct {
	site string
	at   time.Time
}

// NewMemberEvidence makes a tracker; zero or negative arguments mean the
// defaults (DefaultEvidenceSites, DefaultEvidenceWindow).
func NewMemberEvidence(sites int, window time.Duration) *MemberEvidence {
	if sites <= 0 {
		sites = DefaultEvidenceSites
	}
	if window <= 0 {
		window = DefaultEvidenceWindow
	}
	return &MemberEvidence{sites: sites, window: window, m: map[string][]siteAt{}}
}

// Contradicted records that member failed site (a FaultSite answer) at now
// while another member then reached that site. It reports whether member is
// now judged broken; its record is cleared then, so one episode yields one
// verdict.
func (e *MemberEvidence) Contradicted(member, site string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	rec := e.m[member]
	if rec == nil && len(e.m) >= maxEvidenceMembers {
		e.m = map[string][]siteAt{}
	}
	kept := rec[:0]
	for _, s := range rec {
		if now.Sub(s.at) < e.window && s.site != site {
			kept = append(kept, s)
		}
	}
	kept = append(kept, siteAt{site: site, at: now})
	if len(kept) >= e.sites {
		delete(e.m, member)
		e.n.Store(int64(len(e.m)))
		return true
	}
	e.m[member] = kept
	e.n.Store(int64(len(e.m)))
	return false
}

// Reached records a success through member: whatever it failed before
// no longer says it is broken.
func (e *MemberEvidence) Reached(member string) {
	if e.n.Load() == 0 {
		return
	}
	e.mu.Lock()
	if _, ok := e.m[member]; ok {
		delete(e.m, member)
		e.n.Store(int64(len(e.m)))
	}
	e.mu.Unlock()
}
