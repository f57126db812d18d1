package rotation

import (
	"hash/maphash"
	"sync"
	"time"
)

// sendBuckets is how many parts of the span a SendLog counts in.
const sendBuckets = 16

// maxSendSites bounds the sites a SendLog shard keeps; past it, sites with
// no request within the span are forgotten, or, when every one had, the
// shard starts over (which only leaves the next first ban without
// evidence).
const maxSendSites = 1024

// sendShards spreads the log's lock over the sites.
const sendShards = 16

// SendLog counts the requests each member sent to each site within a
// span (PaceRule.Pause), in sendBuckets parts of it: what a site's first
// ban is judged by (BanEvidence), kept for every site since no site is
// known to limit before it bans. It is pure bookkeeping (the caller passes
// the clock), safe for concurrent use, one sharded lock per request, and
// bounded: per site and member a few dozen bytes, sendShards*maxSendSites
// sites.
type SendLog struct {
	span   time.Duration
	bucket time.Duration
	seed   maphash.Seed
	shards [sendShards]sendShard
}

type sendShard struct {
	mu    sync.Mutex
	sites map[string]*siteSends
}

// siteSends is one site's members, and its leader: the one member that
// may go past what the others have had answered (SendLog.Trail).
type siteSends struct {
	members map[string]*memberSends
	leader  string
}

// memberSends is one member's requests to one site: counts per bucket
// (the bucket of index i%sendBuckets) of those sent and of those answered
// without a ban, the last bucket index written, and the time of the first
// request still counted.
type memberSends struct {
	counts [sendBuckets]uint32
	oks    [sendBuckets]uint32
	last   int64
	first  time.Time
	lastAt time.Time
}

// NewSendLog makes a log over span (0: nothing is logged).
func NewSendLog(span time.Duration) *SendLog {
	l := &SendLog{span: span, bucket: span / sendBuckets, seed: maphash.MakeSeed()}
	if l.bucket <= 0 {
		l.bucket = 1
	}
	for i := range l.shards {
		l.shards[i].sites = map[string]*siteSends{}
	}
	return l
}

func (l *SendLog) shard(site string) *sendShard {
	return &l.shards[maphash.String(l.seed, site)%sendShards]
}

// advance drops the buckets older than the span as of bucket index b.
func (m *memberSends) advance(b int64) {
	if b-m.last >= sendBuckets {
		m.counts = [sendBuckets]uint32{}
		m.oks = [sendBuckets]uint32{}
		m.first = time.Time{}
	} else {
		for i := m.last + 1; i <= b; i++ {
			m.counts[i%sendBuckets] = 0
			m.oks[i%sendBuckets] = 0
		}
	}
	if b > m.last {
		m.last = b
	}
}

// member returns member's record at site as of bucket b, making both
// (sh.mu held).
func (l *SendLog) member(sh *sendShard, site, member string, b int64, now time.Time) (*siteSends, *memberSends) {
	ss := sh.sites[site]
	if ss == nil {
		if len(sh.sites) >= maxSendSites {
			sh.sweep(now, l.span)
		}
		ss = &siteSends{members: map[string]*memberSends{}}
		sh.sites[site] = ss
	}
	m := ss.members[member]
	if m == nil {
		m = &memberSends{last: b}
		ss.members[member] = m
	}
	m.advance(b)
	return ss, m
}

// Sent records a request of member to site at now.
func (l *SendLog) Sent(site, member string, now time.Time) {
	if l == nil || l.span <= 0 {
		return
	}
	b := now.UnixNano() / int64(l.bucket)
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ss, m := l.member(sh, site, member, b, now)
	if ss.leader == "" {
		ss.leader = member
	}
	m.record(b, now)
}

// Answered records that the site answered a request of member without a
// ban, at now.
func (l *SendLog) Answered(site, member string, now time.Time) {
	if l == nil || l.span <= 0 {
		return
	}
	b := now.UnixNano() / int64(l.bucket)
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, m := l.member(sh, site, member, b, now)
	m.oks[b%sendBuckets]++
}

// Trail is the rule that keeps a burst from taking every member over a
// site's limit at once: one member, the site's leader, may go past what
// the site has answered; every other member may send only while it has
// sent fewer than the most any member had answered within the span. So
// when the leader's request is refused, no other member has gone past a
// count the site was seen to allow. It reports whether member may send
// now (and then records its request, as Sent, in the same step: two
// requests of one member never both pass on one count), and else the
// leader to send through instead. A site with no leader yet makes member
// its leader.
func (l *SendLog) Trail(site, member string, now time.Time) (ok bool, leader string) {
	if l == nil || l.span <= 0 {
		return true, member
	}
	b := now.UnixNano() / int64(l.bucket)
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ss, m := l.member(sh, site, member, b, now)
	ok = ss.leader == "" || ss.leader == member
	if !ok {
		sent := sum(&m.counts)
		for _, o := range ss.members {
			o.advance(b)
			if sum(&o.oks) > sent {
				ok = true
				break
			}
		}
	}
	if !ok {
		return false, ss.leader
	}
	if ss.leader == "" {
		ss.leader = member
	}
	m.record(b, now)
	return true, ss.leader
}

// record counts a request sent at now, in bucket b.
func (m *memberSends) record(b int64, now time.Time) {
	m.counts[b%sendBuckets]++
	if m.first.IsZero() {
		m.first = now
	}
	m.lastAt = now
}

// Lead makes member the site's leader and records its request: the
// leader could not be had (it rests, or left the pool), so the member
// that goes instead leads.
func (l *SendLog) Lead(site, member string, now time.Time) {
	if l == nil || l.span <= 0 {
		return
	}
	b := now.UnixNano() / int64(l.bucket)
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ss, m := l.member(sh, site, member, b, now)
	ss.leader = member
	m.record(b, now)
}

func sum(c *[sendBuckets]uint32) uint32 {
	var n uint32
	for _, v := range c {
		n += v
	}
	return n
}

// sweep forgets the sites no member sent to within span; when that frees
// nothing, the shard starts over.
func (sh *sendShard) sweep(now time.Time, span time.Duration) {
	for site, ss := range sh.sites {
		idle := true
		for _, m := range ss.members {
			if now.Sub(m.lastAt) < span {
				idle = false
				break
			}
		}
		if idle {
			delete(sh.sites, site)
		}
	}
	if len(sh.sites) >= maxSendSites {
		sh.sites = map[string]*siteSends{}
	}
}

// Evidence is what member sent to site within the span up to now.
func (l *SendLog) Evidence(site, member string, now time.Time) BanEvidence {
	if l == nil || l.span <= 0 {
		return BanEvidence{}
	}
	b := now.UnixNano() / int64(l.bucket)
	sh := l.shard(site)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ss := sh.sites[site]
	if ss == nil || ss.members[member] == nil {
		return BanEvidence{}
	}
	m := ss.members[member]
	m.advance(b)
	var ev BanEvidence
	oldest := int64(-1)
	for i := b - sendBuckets + 1; i <= b; i++ {
		k := ((i % sendBuckets) + sendBuckets) % sendBuckets
		ev.Served += int(m.oks[k])
		ev.Sent += int(m.counts[k])
		if m.counts[k] > 0 && oldest < 0 {
			oldest = i
		}
	}
	if oldest < 0 {
		return BanEvidence{}
	}
	for _, o := range ss.members {
		if o.lastAt.After(now.Add(-l.span)) {
			ev.Members++
		}
	}
	// The first request still counted, or, once its bucket left the
	// span, the start of the oldest bucket kept.
	from := time.Unix(0, oldest*int64(l.bucket))
	if m.first.After(from) {
		from = m.first
	}
	ev.Span = max(now.Sub(from), 0)
	return ev
}
