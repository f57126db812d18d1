package pacing

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// settleWait bounds how long a ban waits for the answers to its
// member's earlier sends before the cut is judged (evidenceLog.settle): a
// round trip or so; a request not back by then is not counted, which
// errs on the slow side.
const settleWait = time.Second

// callTimeout bounds a call to the store made after the request's
// context may have ended (a place given back, a slot returned, an answer
// fed to the learnt pace), as the gateway bounds its other calls to the
// pool.
const callTimeout = 5 * time.Second

// Error is a request that could not get its slot within MaxWait (or its
// own deadline): the gateway answers it 503 paced.
type Error struct {
	// RetryAfter is when the slot comes (the answer's Retry-After).
	RetryAfter time.Duration
	msg        string
}

func (e *Error) Error() string { return e.msg }

// Ticket is a request's place in its site's pace, kept by the request
// from its first attempt until it ends (Leave): its deadline for waiting,
// the place in flight it holds, the cut its last attempt went out under.
// The request path sets Due and Trail; the rest is the pacer's.
type Ticket struct {
	// Due is the request's own deadline (--request-timeout, plain HTTP);
	// zero for none. A slot past it is refused at once.
	Due time.Time
	// Trail: the gateway sees the request's answer, so it trails the
	// site's leader before the first ban (evidenceLog.trail).
	Trail bool

	place    Place
	seq      int       // the attempt's place among its member's sends in the site's run (trail); 0 when not trailed
	deadline time.Time // when waiting must end: MaxWait after the first wait, or Due
	started  bool      // the deadline is set
	dueHeld  bool      // Due, not MaxWait, set deadline
	cuts     int       // the learnt pace's cuts the last attempt was paced under
	began    time.Time // the request's first attempt came to the pacer (moveOff)
}

// Place is a place in flight among a site's requests, held by a request
// until it ends; the zero Place is none.
type Place struct {
	sp     *sitePace      // the site's view
	by     pool.SitePacer // where the place is held
	site   string
	holder string // the place's id
}

// Held reports whether pl is a place (not the zero Place).
func (pl Place) Held() bool { return pl.sp != nil }

// TakePlace returns the place in flight t holds (the zero Place when it
// holds none) and clears it, so that it is left once. The place is handed
// over by value: the request the ticket is part of stays where it is (a
// pointer into it through an interface would move every request to the
// heap).
func (t *Ticket) TakePlace() Place {
	pl := t.place
	t.place = Place{}
	return pl
}

// Attempt is what the pacer reads of one attempt of a request.
type Attempt struct {
	Site   string        // the target key (rotation.HostKey)
	Member string        // the member of the lease in hand
	Client time.Duration // the client's own pace (params.Params.Pace)
}

// Move is the leasing stage's side of a request that may take another
// member when its own member's slot is far off; its zero value keeps the
// request on its member (a strict session, a member named by the client).
// The pacer calls Other at most once per attempt, and Settle after an
// Other that named a member. It is a parameter of Pace of its own, not a
// field of Attempt: the attempt's strings go on to the store, and the
// closures would go to the heap with them.
type Move struct {
	// Other leases another member, neither the request's own nor one it
	// tried, and returns its name; "" when the pool offers none (a member
	// it leased then is given back already).
	Other func(ctx context.Context) string
	// Settle gives back the member the pacer did not keep: Other's when
	// keepOther is false, else the request's own, Other's then becoming
	// the request's lease.
	Settle func(ctx context.Context, keepOther bool)
}

// Pace is the pacing step of a request's attempt: before the attempt,
// wait for the site's place in flight and for the member's next slot, or
// take another member that is free sooner (mv). An error ends the
// request (the client left, or the wait would pass MaxWait: *Error); a
// member mv took is the request's all the same, for it to give back.
func (p *Pacer) Pace(ctx, client context.Context, t *Ticket, a Attempt, mv Move) error {
	if t.began.IsZero() {
		t.began = time.Now()
	}
	if t.Trail && p != nil && p.evidence != nil {
		t.seq = 0
		// A site with a pace of the operator's or the client's is known:
		// it is paced as told, not trailed (and a request that takes a
		// member free sooner would leave its count on the first).
		if lim, _ := p.o.explicitFor(a.Site, a.Client); lim.IsZero() {
			seq, err := p.trail(ctx, client, a.Site, a.Member)
			if err != nil {
				return err
			}
			t.seq = seq
		}
	}
	if !p.paced(a.Client) {
		return nil
	}
	target := a.Site
	lim, src := p.o.explicitFor(target, a.Client)
	now := time.Now()
	p.mu.Lock()
	var learnt rotation.LearntPace
	if p.o.Auto {
		learnt = p.learntFor(p.sites[target], now)
	}
	if lim.IsZero() && !learnt.Slowed() {
		p.mu.Unlock()
		return nil
	}
	sp := p.site(target)
	p.mu.Unlock()
	if !t.started {
		t.deadline, t.started = now.Add(p.o.MaxWait), true
		if !t.Due.IsZero() && t.Due.Before(t.deadline) {
			// A wait past the request's own deadline could only end in
			// a 504: the slot is refused at once, 503 paced.
			t.deadline, t.dueHeld = t.Due, true
		}
	}
	t.cuts = learnt.Cuts
	if lim.MaxConcurrency > 0 && t.place.sp == nil {
		limit := "site " + target + " allows " + strconv.Itoa(lim.MaxConcurrency) + " requests in flight across the pool (" + concSource(src) + ")"
		if err := p.waitPlace(ctx, client, t, target, sp, lim.MaxConcurrency, limit); err != nil {
			return err
		}
	}
	if lim.MinInterval <= 0 && !learnt.Slowed() {
		return nil
	}
	req := pool.SlotRequest{Site: target, Member: a.Member, MinInterval: lim.MinInterval, Auto: p.o.Auto, MaxWait: time.Until(t.deadline)}
	moved := false
	if learnt.Slowed() && mv.Other != nil && p.bannedHere(sp, a.Member, t.began, now) {
		req.Member, moved = p.moveOff(ctx, mv, a.Member), true
	}
	slot, by := p.reserve(ctx, req, sp)
	if slot.Interval <= 0 {
		return nil
	}
	if slot.Wait > time.Millisecond && mv.Other != nil && !moved {
		req, slot, by = p.sooner(ctx, mv, sp, req, slot, by)
	}
	if req.Auto {
		// The cut the request goes out under is the store's, as it set
		// the slot: the view's may be older (cut since by another
		// gateway, or known only from the list of slowed sites), and a
		// ban to the request would pass for one in flight at the cut.
		t.cuts = slot.Learnt.Cuts
	}
	isrc := src
	if slot.Learnt.Interval > lim.MinInterval {
		isrc = "learnt after a " + string(slot.Learnt.Cause) + " answer at " + slot.Learnt.CutAt.UTC().Format(time.TimeOnly) + " (--pacing auto)"
	}
	limit := "site " + target + ": one request per " + slot.Interval.String() + " per member (" + isrc + ")"
	if !slot.Reserved {
		p.mu.Lock()
		sp.refused++
		sp.lastLimit = limit
		p.mu.Unlock()
		return &Error{RetryAfter: slot.Wait, msg: "paced: " + limit + "; the next slot is in " + slot.Wait.Round(time.Millisecond).String() + ", past " + t.waitBound(p.o.MaxWait)}
	}
	return p.waitSlot(ctx, client, sp, target, req.Member, slot, by, limit)
}

// AttemptFailed tells the trail that member's attempt at site ended
// without an answer, so it no longer counts in flight for the member.
func (p *Pacer) AttemptFailed(t *Ticket, site, member string) {
	if p != nil && t.Trail && p.evidence != nil {
		p.evidence.unserved(site, member, time.Now())
	}
}

// trail holds a request to a site not slowed behind the site's leader
// (evidenceLog.trail) until the site has served the leader more than the
// member has sent, the site is slowed (its pace then holds the request),
// or the lead comes to the member. It waits at most MaxWait, then sends.
// It returns the send's place in the member's run (0: not counted, the
// site slowed or the wait over).
func (p *Pacer) trail(ctx, client context.Context, target, member string) (int, error) {
	var timer *time.Timer
	for {
		if p.learnt.Load() > 0 {
			p.mu.Lock()
			slowed := p.learntFor(p.sites[target], time.Now()).Slowed()
			p.mu.Unlock()
			if slowed {
				return 0, nil
			}
		}
		seq, wake := p.evidence.trail(target, member, time.Now())
		if seq > 0 {
			return seq, nil
		}
		if timer == nil {
			timer = time.NewTimer(p.o.MaxWait)
			defer timer.Stop()
		}
		takeover := time.NewTimer(trailTakeover)
		select {
		case <-wake:
		case <-takeover.C:
		case <-timer.C:
			takeover.Stop()
			return 0, nil
		case <-client.Done():
			takeover.Stop()
			return 0, fault.ErrClientGone
		case <-ctx.Done():
			takeover.Stop()
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return 0, err
			}
			return 0, fault.ErrClientGone
		}
		takeover.Stop()
	}
}

// reserve asks the store for req's slot, falling back to the gateway's own
// pace while the store fails (pacing goes on, per gateway, through an
// outage). It puts the learnt pace the store told into the view, and
// returns who holds the slot.
func (p *Pacer) reserve(ctx context.Context, req pool.SlotRequest, sp *sitePace) (pool.Slot, pool.SitePacer) {
	by := p.store
	slot, err := by.ReserveSlot(ctx, req)
	if err != nil {
		p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", req.Site, "err", err)
		by = p.own
		slot, _ = by.ReserveSlot(ctx, req)
	}
	if req.Auto {
		p.mu.Lock()
		p.setLearnt(sp, slot.Learnt)
		p.mu.Unlock()
	}
	return slot, by
}

// waitBound names what ended t's wait: --pacing-max-wait (maxWait), or
// the request's own deadline.
func (t *Ticket) waitBound(maxWait time.Duration) string {
	if t.dueHeld {
		return "the request's deadline (--request-timeout)"
	}
	return "--pacing-max-wait " + maxWait.String()
}

func concSource(src string) string {
	if src == "--site-pace" {
		return src
	}
	return "--site-max-concurrency"
}

// newHolder is a fresh id for a place in flight.
func newHolder() string { return rand.Text() }

// waitPlace takes a place among the site's requests in flight, waiting
// for one until the request's deadline: woken when a request here leaves,
// and asking the store again now and then for a place another gateway
// gave back.
func (p *Pacer) waitPlace(ctx, client context.Context, t *Ticket, target string, sp *sitePace, limit int, why string) error {
	holder := newHolder()
	timer := time.NewTimer(time.Until(t.deadline))
	defer timer.Stop()
	poll := placePollMin
	queued := false
	defer func() {
		if queued {
			p.mu.Lock()
			sp.queued--
			p.mu.Unlock()
		}
	}()
	for {
		p.mu.Lock()
		wake := sp.wake
		p.mu.Unlock()
		by := p.store
		in, err := by.EnterSite(ctx, target, holder, limit)
		if err != nil {
			p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", target, "err", err)
			// The store may have taken the place before the call failed
			// (its answer lost, this request's context ended mid-call):
			// give it back, or the site counts it in flight for
			// pool.PaceHold. A fresh holder goes on, so the give-back
			// never takes a place a later call got.
			p.giveBackLater(target, holder)
			holder = newHolder()
			by = p.own
			in, _ = by.EnterSite(ctx, target, holder, limit)
		}
		if in {
			p.mu.Lock()
			sp.inflight++
			p.mu.Unlock()
			t.place = Place{sp: sp, by: by, site: target, holder: holder}
			return nil
		}
		if !queued {
			queued = true
			p.mu.Lock()
			sp.queued++
			sp.lastLimit = why
			p.mu.Unlock()
		}
		pollT := time.NewTimer(poll)
		poll = min(2*poll, placePollMax)
		select {
		case <-wake:
		case <-pollT.C:
		case <-timer.C:
			pollT.Stop()
			p.mu.Lock()
			sp.refused++
			p.mu.Unlock()
			return &Error{RetryAfter: time.Second, msg: "paced: " + why + "; no place came free within " + t.waitBound(p.o.MaxWait)}
		case <-client.Done():
			pollT.Stop()
			return fault.ErrClientGone
		case <-ctx.Done():
			pollT.Stop()
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return fault.ErrClientGone
		}
		pollT.Stop()
	}
}

// maxGivingBack bounds the give-backs (giveBackLater) in flight at once:
// while the store is down every request with a place to wait for fails
// one, and past it a place is left to expire after pool.PaceHold rather
// than pile up calls on a store that does not answer.
const maxGivingBack = 64

// giveBackLater leaves, in the background, a place the store may hold for
// holder after a call that failed; a failure (or too many give-backs at
// once) leaves it to expire after pool.PaceHold.
func (p *Pacer) giveBackLater(site, holder string) {
	if p.givingBack.Add(1) > maxGivingBack {
		p.givingBack.Add(-1)
		return
	}
	go func() {
		defer p.givingBack.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := p.store.LeaveSite(ctx, site, holder); err != nil {
			p.log.Debug("pacing: giving back a place a failed call may have taken failed; it counts until it expires", "site", site, "err", err)
		}
	}()
}

// Leave ends the place in flight pl (Ticket.TakePlace) and wakes the
// requests waiting here for one; the zero Place is left as it is.
func (p *Pacer) Leave(pl Place) {
	sp := pl.sp
	if sp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := pl.by.LeaveSite(ctx, pl.site, pl.holder); err != nil {
		p.log.Warn("pacing: giving a place in flight back failed; it counts until it expires", "site", pl.site, "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sp.inflight--
	close(sp.wake)
	sp.wake = make(chan struct{})
}

// Answered feeds site's answer through member to the request of t into
// the site's learnt pace: a ban signal cuts it at once, before the next
// request to the site is paced; any other answer raises it a step.
// Answers of a site the view does not know as slowed cost nothing.
func (p *Pacer) Answered(t *Ticket, site, member string, res rotation.Result) {
	if p == nil || !p.o.Auto {
		return
	}
	target := site
	if !res.IsBan() {
		if p.evidence != nil {
			p.evidence.served(target, member, time.Now())
		}
		if p.learnt.Load() == 0 {
			return
		}
	}
	if res.IsBan() {
		// The member's sends before this one may be answered a moment
		// after it: wait for them (at most settleWait), so the count the
		// cut is judged by is what the site served.
		p.evidence.settle(target, member, t.seq, settleWait)
	}
	now := time.Now()
	if res.IsBan() {
		defer p.evidence.unserved(target, member, now)
	}
	p.mu.Lock()
	sp := p.sites[target]
	was := p.learntFor(sp, now)
	p.mu.Unlock()
	if !res.IsBan() && !was.Slowed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	a := pool.SiteAnswer{Site: target, Member: member, Result: res, SeenCuts: t.cuts}
	if res.IsBan() {
		ev := p.evidence.evidence(target, member, now)
		// The others' sends are known when every request to the site
		// trailed here: on this gateway's own pace (no other gateway sends
		// through the members), before the site was slowed (after, the
		// members go by the pace, untrailed).
		ev.OthersKnown = p.alone && !was.Slowed()
		a.FirstCut = p.o.Rule.FirstCut(ev)
	}
	l, err := p.store.SiteAnswered(ctx, a)
	if err != nil {
		p.log.Warn("pacing: the lease store's pace failed; pacing with this gateway's own", "site", target, "err", err)
		l, _ = p.own.SiteAnswered(ctx, a)
	}
	p.mu.Lock()
	if sp == nil {
		sp = p.site(target)
	}
	p.setLearnt(sp, l)
	if res.IsBan() && l.Slowed() {
		p.markBanned(sp, member, now)
	}
	p.mu.Unlock()
	if l.Cuts > was.Cuts || (l.Slowed() && !was.Slowed()) {
		p.log.Info("site answered with a ban signal: slowed for the whole pool", "target", target, "answer", string(res), "member", member, "pace", l.String())
	}
}

// bannedMoveWindow is how long after a site banned a member a request
// still holding a lease on that member is moved off it (moveOff): the
// requests leased on it before the ban wait behind the site's leader or
// for the cut's pause, and reach their slot well within it; the pool
// leases the member to nobody for the site until its cooldown ends, so a
// lease on it after this window is a new one, after the ban (one within
// it, after a Retry-After shorter than the window, is moved needlessly:
// it costs the choice, not the request).
func (p *Pacer) bannedMoveWindow() time.Duration { return p.o.MaxWait }

// bannedHere reports whether site (its view sp) banned member within
// bannedMoveWindow of now, after a request that began at began: only a
// request leased on the member before its ban is moved off it. One that
// began after it was leased the member once the pool let it (its cooldown
// over: a Retry-After of 2s is 2s, not bannedMoveWindow).
func (p *Pacer) bannedHere(sp *sitePace, member string, began, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := sp.banned[member]
	if ok && !now.Before(at.Add(p.bannedMoveWindow())) {
		delete(sp.banned, member)
		return false
	}
	return ok && began.Before(at)
}

// markBanned records that site (its view sp) banned member at now
// (p.mu held).
func (p *Pacer) markBanned(sp *sitePace, member string, now time.Time) {
	if sp.banned == nil {
		sp.banned = map[string]time.Time{}
	}
	for m, at := range sp.banned {
		if !now.Before(at.Add(p.bannedMoveWindow())) {
			delete(sp.banned, m)
		}
	}
	sp.banned[member] = now
}

// moveOff takes the request off member, which the site banned, onto
// another member the leasing stage offers (mv), and returns the member it
// goes through: the other, or member when the pool offers none. A request
// leased on the member before its ban (it waited behind the site's
// leader, or in the burst) would wait for the member's slot only to be
// refused and retried at the back of the queue: with a pause of the
// whole site and a long interval, that wait and the retry's pushed a burst
// past --pacing-max-wait (25 of 60 served at 3 per 3s, concurrency 16).
func (p *Pacer) moveOff(ctx context.Context, mv Move, member string) string {
	other := mv.Other(ctx)
	if other == "" {
		return member
	}
	mv.Settle(ctx, true)
	return other
}

// sooner asks the leasing stage for one other member (mv) and reserves
// its slot for the site when it comes before slot (and within the wait
// allowed), keeping whichever of the two is free sooner; the other's slot
// and lease are given back. It returns the kept member's request, slot
// and store.
func (p *Pacer) sooner(ctx context.Context, mv Move, sp *sitePace, req pool.SlotRequest, slot pool.Slot, by pool.SitePacer) (pool.SlotRequest, pool.Slot, pool.SitePacer) {
	other := mv.Other(ctx)
	if other == "" {
		return req, slot, by
	}
	areq := req
	areq.Member = other
	areq.MaxWait = min(req.MaxWait, slot.Wait-time.Millisecond)
	aslot, aby := p.reserve(ctx, areq, sp)
	if !aslot.Reserved || aslot.Wait >= slot.Wait {
		mv.Settle(ctx, false)
		return req, slot, by
	}
	if slot.Reserved {
		_ = by.ReturnSlot(ctx, req.Site, req.Member, slot.Token)
	}
	mv.Settle(ctx, true)
	return areq, aslot, aby
}

// waitSlot waits for a reserved slot; a request that leaves first gives
// the slot back (unless a later one reserved behind it).
func (p *Pacer) waitSlot(ctx, client context.Context, sp *sitePace, site, member string, slot pool.Slot, by pool.SitePacer, limit string) error {
	if slot.Wait <= 0 {
		return nil
	}
	p.mu.Lock()
	sp.queued++
	sp.waited++
	sp.waitedFor += slot.Wait
	sp.lastLimit = limit
	p.mu.Unlock()
	timer := time.NewTimer(slot.Wait)
	var err error
	select {
	case <-timer.C:
	case <-client.Done():
		err = fault.ErrClientGone
	case <-ctx.Done():
		err = context.Cause(ctx)
		if err == nil || errors.Is(err, context.Canceled) {
			err = fault.ErrClientGone
		}
	}
	timer.Stop()
	p.mu.Lock()
	sp.queued--
	p.mu.Unlock()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		_ = by.ReturnSlot(rctx, site, member, slot.Token)
		cancel()
	}
	return err
}
