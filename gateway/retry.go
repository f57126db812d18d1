package gateway

import (
	"context"
	"errors"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// retryRule is how far a request may go on to other members after a
// failure judge allows retrying.
type retryRule struct {
	// retryable: the request may be sent again at all. When it may not,
	// the first failure ends it, saying so of method.
	retryable bool
	method    string
	// maxRetries bounds the further attempts; negative is no bound (CONNECT
	// tries members while the pool offers new ones: a tunnel that is not
	// up yet has sent nothing).
	maxRetries int
}

// served is what a protocol's attempt step reports when it ends well: the
// request is served through the member (the step keeps what it got), or
// the member's answer was let go (a ban) and another member may serve.
type served bool

const (
	servedHere served = true
	tryAnother served = false
)

// tryMembers is the one retry loop of both protocols: lease a member, wait
// for its slot in the site's pace (pace), make one attempt through it (try), and after a failure let judge decide
// whether another member may serve, within rule. It returns nil when try
// served the request (rq then holds its lease), or the error that ends it:
// the client's or the pool's, one judge does not retry (finish ends the
// lease still held), or the members' record once it is enough.
//
// What differs between CONNECT and plain HTTP is inside try: how to send,
// how to read the answer; a try whose member answered anything reports so
// with a nil error, and the loop then credits the member (reached).
func (rp *requestPath) tryMembers(ctx, client context.Context, rq *request, at *attempts, rule retryRule, try func(h held, attempt int) (served, error)) error {
	// A token client past its rates is refused before anything is leased
	// or sent; retries of the request are not requests of their own.
	if err := rp.leases.quota.admit(ctx, &rq.lr); err != nil {
		return err
	}
	if err := rp.tier(ctx, rq); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		h := rq.next
		rq.next = held{}
		if h.mc == nil {
			var err error
			for {
				if h, err = rp.leases.lease(ctx, client, rq); err == nil || !rp.tierUp(rq, err) {
					break
				}
			}
			if err != nil {
				if at.last == nil || errors.Is(err, fault.ErrClientGone) {
					return err
				}
				return at.giveUp("; no other member: " + err.Error())
			}
		}
		if at.triedBefore(h.mc.Member.Name) {
			// The pool offered a member that failed this request already
			// (a remote report was lost): unpin it too, so the session's
			// next request asks the pool again.
			rp.leases.release(ctx, rq.lr, h)
			if h.resting {
				// The override's least recently failed member is one
				// this request failed on: every other rests too.
				return at.giveUp("; no other member: the members left rest for their own failures and this request tried them")
			}
			return at.giveUp("")
		}
		// Pacing: wait for the site's slot on this member, or take another
		// member free sooner, or end the request paced.
		if err := rp.pace(ctx, client, rq, at, &h); err != nil {
			rp.leases.done(ctx, h)
			return err
		}
		rq.use(h)
		s, err := try(h, attempt)
		if err == nil {
			// The site answered through this member, whatever it said.
			rp.health.MemberAnswered(ctx, h.health())
			rp.health.Reached(ctx, rq.member, rq.lr.target, at.fails)
			at.fails = nil
			if s == servedHere {
				return nil
			}
			continue
		}
		rp.pacer.AttemptFailed(&rq.pace, rq.lr.target, rq.member)
		v := judge(err)
		if !v.retry {
			return err
		}
		ae := fault.Of(err)
		rp.log.Debug("attempt through member failed", "member", rq.member, "target", rq.lr.target, "fault", ae.F.Class, "err", err)
		if ae.F.Class == fault.ClassAnswerTimeout {
			rp.health.CheckAlive(ctx, h.health(), rq.lr.target)
		}
		rp.leases.drop(ctx, rq.lr, h, v.report, 0)
		if v.report == rotation.ResultUpstreamFailed {
			rp.health.MemberFailed(h.health(), ae.F.Class)
		}
		rq.h = held{}
		if rq.lr.p.Strict {
			return rp.leases.lostSession(rq, h, "failed ("+err.Error()+")")
		}
		switch {
		case at.failed(h, ae, rp.retries) || (rule.maxRetries >= 0 && attempt >= rule.maxRetries):
			return at.giveUp("")
		case !rule.retryable:
			return at.giveUp("; not tried on another member: a " + rule.method + " request or one with a body may not be sent twice")
		}
	}
}

// tier is the tier stage's step of tryMembers, once per request: its
// lease request narrowed to the tier its site starts on (a copy of its
// parameters with the tier in the selector, so a sticky session's pin on
// another tier's member is let go as one on another selector is).
func (rp *requestPath) tier(ctx context.Context, rq *request) error {
	if rp.tiers == nil {
		return nil
	}
	sel, tk, err := rp.tiers.Start(ctx, rq.lr.target, rq.lr.p.Client, rq.lr.p.Selector, rq.lr.p.Proxy)
	if err != nil || !tk.On() {
		return err
	}
	p := *rq.lr.p
	p.Selector = sel
	rq.lr.p, rq.tier = &p, tk
	return nil
}

// tierUp moves rq one tier up when err is the pool's refusal of its
// tier (tiering.Tiering.Up): true when the lease is worth asking again.
func (rp *requestPath) tierUp(rq *request, err error) bool {
	var nm *pool.NoMatchError
	if rp.tiers == nil || !errors.As(err, &nm) {
		return false
	}
	sel, up := rp.tiers.Up(&rq.tier, rq.lr.p.Selector)
	if !up {
		return false
	}
	p := *rq.lr.p
	p.Selector = sel
	rq.lr.p = &p
	return true
}

// acquireNext is leasing's acquire of the next attempt's lease after a
// ban, going up the tiers while rq's has no usable member left.
func (rp *requestPath) acquireNext(ctx context.Context, rq *request) (held, error) {
	for {
		h, err := rp.leases.acquire(ctx, &rq.lr)
		if err == nil || !rp.tierUp(rq, err) {
			return h, err
		}
	}
}

// tierAnswered tells the tier stage what the site answered through h. A
// probe the site banned is retried on the site's own tier, not on another
// member of the tier it just refused.
func (rp *requestPath) tierAnswered(ctx context.Context, rq *request, h held, res rotation.Result) {
	if rp.tiers == nil {
		return
	}
	rp.tiers.Answered(ctx, rq.tier, rq.lr.target, h.mc.Member.Attributes, res)
	if res.IsBan() && rq.tier.Probe {
		if sel, up := rp.tiers.Up(&rq.tier, rq.lr.p.Selector); up {
			p := *rq.lr.p
			p.Selector = sel
			rq.lr.p = &p
		}
	}
}

// pace is the pacing stage's step of tryMembers for an attempt through
// *h. A request that may move (no member named by the client, not strict)
// lends the pacer the leasing stage's side of taking another member free
// sooner; the one kept is left in *h, the other given back.
func (rp *requestPath) pace(ctx, client context.Context, rq *request, at *attempts, h *held) error {
	var mv pacing.Move
	if rq.lr.p.Proxy == "" && !rq.lr.p.Strict {
		var alt held
		mv = pacing.Move{
			Other: func(ctx context.Context) string {
				var err error
				if alt, err = rp.leases.acquireFresh(ctx, rq.lr, false); err != nil {
					return ""
				}
				if alt.mc.Member.Name == h.mc.Member.Name || at.triedBefore(alt.mc.Member.Name) {
					rp.leases.done(ctx, alt)
					return ""
				}
				return alt.mc.Member.Name
			},
			Settle: func(ctx context.Context, keepOther bool) {
				if keepOther {
					*h, alt = alt, *h
				}
				rp.leases.done(ctx, alt)
			},
		}
	}
	return rp.pacer.Pace(ctx, client, &rq.pace, pacing.Attempt{Site: rq.lr.target, Member: h.mc.Member.Name, Client: rq.lr.p.Pace}, mv)
}

// leavePace ends rq's place in flight (when it holds one) at pl, the
// pacing stage.
func (rq *request) leavePace(pl placeLeaver) {
	if place := rq.pace.TakePlace(); place.Held() {
		pl.Leave(place)
	}
}
