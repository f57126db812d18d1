package gateway

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
	sites map[string]map[string]*memberRun
}

// memberRun is one member's served requests at one site since its run
// began.
type memberRun struct {
	served      int
	first, last time.Time
}

// newEvidenceLog makes a log over window (0: nil, nothing is logged).
func newEvidenceLog(window time.Duration) *evidenceLog {
	if window <= 0 {
		return nil
	}
	l := &evidenceLog{window: window, seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].sites = map[string]map[string]*memberRun{}
	}
	return l
}

func (l *evidenceLog) shard(site string) *evidenceShard {
	return &l.shards[maphash.String(l.seed, site)%evidenceShards]
}

// served records that site served member a request at now.
func (l *evidenceLog) served(site, member string, now time.Time) {
	if l == nil {
		return
	}
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ms := sh.sites[site]
	if ms == nil {
		if len(sh.sites) >= maxEvidenceSites {
			sh.sweep(now, l.window)
		}
		ms = map[string]*memberRun{}
		sh.sites[site] = ms
	}
	r := ms[member]
	if r == nil {
		r = &memberRun{}
		ms[member] = r
	}
	if r.served == 0 || now.Sub(r.last) >= l.window {
		*r = memberRun{first: now}
	}
	r.served++
	r.last = now
}

// sweep forgets the sites no member was served by within window; when
// that frees nothing, the shard starts over (sh.mu held).
func (sh *evidenceShard) sweep(now time.Time, window time.Duration) {
	for site, ms := range sh.sites {
		idle := true
		for _, r := range ms {
			if now.Sub(r.last) < window {
				idle = false
				break
			}
		}
		if idle {
			delete(sh.sites, site)
		}
	}
	if len(sh.sites) >= maxEvidenceSites {
		sh.sites = map[string]map[string]*memberRun{}
	}
}

// evidence is what site served member in its run up to a ban at now.
func (l *evidenceLog) evidence(site, member string, now time.Time) rotation.BanEvidence {
	if l == nil {
		return rotation.BanEvidence{}
	}
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.sites[site][member]
	if r == nil || r.served == 0 || now.Sub(r.last) >= l.window {
		return rotation.BanEvidence{}
	}
	return rotation.BanEvidence{Served: r.served, Span: now.Sub(r.first)}
}
