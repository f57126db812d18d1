package pacing

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// evidenceShards spreads the evidence log's lock over the sites;
// maxEvidenceSites bounds the sites one shard keeps.
const (
	evidenceShards   = 16
	maxEvidenceSites = 1024
)

// evidenceLog is what a site's first ban is judged by
// (rotation.PaceRule.FirstCut): per site and member, the requests the
// site served in the member's current run (requests less than the rule's
// Window apart) and when the run began. No site is known to limit before
// it bans, so it is kept for every site: one sharded lock per answer, a
// few dozen bytes per site and member, evidenceShards*maxEvidenceSites
// sites (past it a shard forgets its idle sites, or starts over, which
// only leaves a later first ban without evidence: the fixed first cut).
type evidenceLog struct {
	window time.Duration
	seed   maphash.Seed
	shards [evidenceShards]evidenceShard
}

type evidenceShard struct {
	mu    sync.Mutex
	sites map[string]*siteRun
}

// siteRun is one site's members since the site's run began (requests less
// than the rule's Window apart), and its leader: the one member that may
// go past what the site has served the others (trail).
type siteRun struct {
	members map[string]*memberRun
	last    time.Time // the run's last send or answer
	leader  string
	led     time.Time     // the leader's last send or answer
	wake    chan struct{} // closed at the next send or answer; nil while nobody waits
}

// memberRun is one member's requests at one site in the site's run: sent,
// served, and when the first served was.
type memberRun struct {
	sent, served, answered int
	first                  time.Time
}

// trailTakeover is how long a leader may go without a send or an answer
// before a member that trails it takes the lead: a leader that left the
// pool, rests or was banned must not hold the others.
const trailTakeover = time.Second

// newEvidenceLog makes a log over window (0: nil, nothing is logged).
func newEvidenceLog(window time.Duration) *evidenceLog {
	if window <= 0 {
		return nil
	}
	l := &evidenceLog{window: window, seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].sites = map[string]*siteRun{}
	}
	return l
}

func (l *evidenceLog) shard(site string) *evidenceShard {
	return &l.shards[maphash.String(l.seed, site)%evidenceShards]
}

// run returns site's run as of now, making it or starting it over after
// a Window without a request (sh.mu held).
func (l *evidenceLog) run(sh *evidenceShard, site string, now time.Time) *siteRun {
	r := sh.sites[site]
	if r == nil {
		if len(sh.sites) >= maxEvidenceSites {
			sh.sweep(now, l.window)
		}
		r = &siteRun{members: map[string]*memberRun{}}
		sh.sites[site] = r
	}
	if now.Sub(r.last) >= l.window {
		clear(r.members)
		r.leader = ""
	}
	return r
}

func (r *siteRun) member(name string) *memberRun {
	m := r.members[name]
	if m == nil {
		m = &memberRun{}
		r.members[name] = m
	}
	return m
}

// served records that site served member a request at now.
func (l *evidenceLog) served(site, member string, now time.Time) {
	if l == nil {
		return
	}
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := l.run(sh, site, now)
	m := r.member(member)
	if m.served == 0 {
		m.first = now
	}
	m.served++
	m.answered++
	r.touch(member, now)
}

// unserved records that member's request at site ended without being
// served (a ban, or an attempt that failed without an answer: it is in
// flight no more) and wakes the requests trailing there; after a ban the
// site is slowed, and they go by its pace instead.
func (l *evidenceLog) unserved(site, member string, now time.Time) {
	if l == nil {
		return
	}
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r := sh.sites[site]; r != nil {
		if m := r.members[member]; m != nil {
			m.answered++
		}
		r.touch(member, now)
	}
}

// touch marks activity of member at now (sh.mu held), waking the waiters.
func (r *siteRun) touch(member string, now time.Time) {
	r.last = now
	if member == r.leader {
		r.led = now
	}
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// waiters is the channel the next touch closes (sh.mu held).
func (r *siteRun) waiters() <-chan struct{} {
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

// trail is the rule that keeps a burst from taking every member to a
// site's limit at once, before the site's first ban: one member, the
// site's leader, goes ahead; every other member sends only while it has
// sent fewer requests in the run than the site has served the leader. So
// when the leader's request is refused, no other member has gone past a
// count the site was seen to allow, and the first ban finds one member
// over the limit, not every member that had a request in flight. The
// leader itself starts slowly: it has at most as many requests in flight
// as the site has served it (one at first), so its answers come back about
// in order and the count it is refused at is what the site allowed, while
// a site without limits is at full speed after a few round trips. A member
// may send (ok, its request counted) or must wait for wake. The first
// member of a run leads; a leader idle for trailTakeover hands the lead to
// the member asking.
//
// seq is the send's place among the member's sends in the run (1 for its
// first), 0 when it must wait.
func (l *evidenceLog) trail(site, member string, now time.Time) (seq int, wake <-chan struct{}) {
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := l.run(sh, site, now)
	m := r.member(member)
	if r.leader != "" && r.leader != member && now.Sub(r.led) >= trailTakeover {
		r.leader = ""
	}
	switch {
	case r.leader == "":
		r.leader = member
	case r.leader == member:
		if m.sent-m.answered >= max(m.served, 1) {
			return 0, r.waiters()
		}
	case m.sent >= r.member(r.leader).served:
		return 0, r.waiters()
	}
	m.sent++
	r.touch(member, now)
	return m.sent, nil
}

// settle waits, for at most wait, until member's sends at site before its
// seq-th of the run (trail) have been answered, or the run is over. A ban
// is judged by what the site served the member (evidence), and the
// leader's slow start has more than one request in flight: one sent
// before the refused one may be served a moment after the refusal comes
// back (seen: a 3-per-3s site served the leader's third request in the
// same millisecond it refused the fourth, and the cut read 2, a pace 50%
// slower than the site allows). Answers to later sends count too, which
// only shortens the wait (the count read is then the lower one).
func (l *evidenceLog) settle(site, member string, seq int, wait time.Duration) {
	if l == nil || seq <= 1 {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		sh := l.shard(site)
		sh.mu.Lock()
		r := sh.sites[site]
		var m *memberRun
		if r != nil {
			m = r.members[member]
		}
		if m == nil || m.sent < seq || m.answered >= seq-1 {
			sh.mu.Unlock()
			return
		}
		wake := r.waiters()
		sh.mu.Unlock()
		select {
		case <-wake:
		case <-timer.C:
			return
		}
	}
}

// sweep forgets the sites with no request within window; when that frees
// nothing, the shard starts over (sh.mu held).
func (sh *evidenceShard) sweep(now time.Time, window time.Duration) {
	for site, r := range sh.sites {
		if now.Sub(r.last) >= window {
			delete(sh.sites, site)
		}
	}
	if len(sh.sites) >= maxEvidenceSites {
		sh.sites = map[string]*siteRun{}
	}
}

// evidence is what site served member in its run up to a ban at now, and
// the most any other member sent in the run (its trailed sends: the
// caller says whether those are every send, BanEvidence.OthersKnown).
func (l *evidenceLog) evidence(site, member string, now time.Time) rotation.BanEvidence {
	if l == nil {
		return rotation.BanEvidence{}
	}
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.sites[site]
	if r == nil || now.Sub(r.last) >= l.window {
		return rotation.BanEvidence{}
	}
	m := r.members[member]
	if m == nil || m.served == 0 {
		return rotation.BanEvidence{}
	}
	ev := rotation.BanEvidence{Served: m.served, Span: now.Sub(m.first)}
	for name, o := range r.members {
		if name != member {
			ev.Others = max(ev.Others, o.sent)
		}
	}
	return ev
}
