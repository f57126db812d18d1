package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/clientbody"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/health"
	"github.com/proxyfleet/proxyfleet/gateway/pacing"
	"github.com/proxyfleet/proxyfleet/gateway/tiering"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// errLeaseFailed marks a pool failure with no more specific answer.
var errLeaseFailed = errors.New("lease failed")

// finisher is the stage every request ends in: the one exit. judge
// decides what a failure means; the finisher settles the lease still held
// (reported and let go, or released), writes the gateway's own answer,
// records the metric and hands the request to the tracer, so that no exit
// can forget one of them. It calls the stages whose state a request holds
// until its end (placeLeaver, exitLeases, failureNoter).
type finisher struct {
	rec    Recorder
	tracer RequestTracer // nil: no request spans
	log    *slog.Logger
	pace   placeLeaver
	leases exitLeases
	health failureNoter
}

// placeLeaver gives a request's place in its site's pace back (pacing).
type placeLeaver interface {
	Leave(pl pacing.Place)
}

// exitLeases ends a request's lease: reported and let go, or done with
// (leasing).
type exitLeases interface {
	drop(ctx context.Context, lr leaseReq, h held, res rotation.Result, retryAfter time.Duration)
	done(ctx context.Context, h held)
}

// failureNoter hears of a member failure reported on a lease (member
// health).
type failureNoter interface {
	MemberFailed(h health.Lease, class string)
}

// request is one client request (or CONNECT) on its way to its end.
type request struct {
	w     http.ResponseWriter
	start time.Time
	lr    leaseReq
	// h is the lease in use; h.mc is nil while none is held.
	h held
	// next is a lease taken for the next attempt (after a ban), used by
	// tryMembers before it asks the pool.
	next held
	// member is the member the metric names: the one in use, else the
	// last one tried.
	member string
	// nameHdr is member's X-Proxyfleet-Proxy value.
	nameHdr []string
	// attempts counts the members the request was sent through (or a
	// tunnel dialled through): X-Proxyfleet-Attempts.
	attempts int
	// body is the request body being forwarded, nil when there is none.
	body *clientbody.Body
	// pace is the request's place in its site's pace (pacing.Pacer.Pace,
	// leavePace).
	pace pacing.Ticket
	// tier is where the request started on the tiers (tiering.Tiering.Start).
	tier tiering.Ticket
	// mirror is the MITM tunnel whose own site connections the request
	// goes through, when the tunnel mirrors the client's handshake; nil
	// for every other request.
	mirror *innerTunnel
}

// RequestTracer receives each proxied request or tunnel once, at its end
// (Options.Tracer). The gateway holds no span while a request runs and
// puts nothing of a trace into the request's context, so nothing it sends
// to a member or a site can carry a trace header; without a tracer a
// request costs one nil check.
type RequestTracer interface {
	TraceRequest(ctx context.Context, t RequestTrace)
}

// RequestTrace is what a request's span records.
type RequestTrace struct {
	// Start is when the request arrived; the span ends when TraceRequest
	// is called: a forwarded request's answer delivered, a tunnel's 200
	// sent, or the gateway's own answer written.
	Start time.Time
	// Member is the member that carried it, else the last one tried ("").
	Member string
	// Target is the site's target key (rotation.HostKey); "" when the
	// request ended before its target was read.
	Target string
	// Outcome is the request metric's outcome (fault.Outcome* constants).
	Outcome string
	// Reason is the gateway's answer's X-Proxyfleet-Reason, "" when the
	// member's (or the site's) answer was relayed.
	Reason string
	// Attempts counts the members the request went through.
	Attempts int
}

// ended records the end of a request the gateway settles at once: its
// metric and, when tracing, its span. Plain HTTP's relayed answers are the
// exception: their metric is taken when the answer's head is written
// (deliver) and their span once the body is through (forward).
func (f *finisher) ended(ctx context.Context, rq *request, outcome, reason string) {
	f.rec.Request(rq.member, outcome, time.Since(rq.start))
	f.trace(ctx, rq, outcome, reason)
}

// trace hands rq to the tracer, if there is one.
func (f *finisher) trace(ctx context.Context, rq *request, outcome, reason string) {
	if f.tracer == nil {
		return
	}
	f.tracer.TraceRequest(ctx, RequestTrace{Start: rq.start, Member: rq.member, Target: rq.lr.target,
		Outcome: outcome, Reason: reason, Attempts: rq.attempts})
}

// use makes h the request's lease for its next attempt.
func (rq *request) use(h held) {
	rq.h, rq.member, rq.nameHdr = h, h.mc.Member.Name, h.mc.NameHdr
	rq.attempts++
}

// attemptsValues are the X-Proxyfleet-Attempts values of the common
// counts, shared so an answer's header costs no allocation.
var attemptsValues = func() [][]string {
	v := make([][]string, 9)
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

// attemptsValue is the X-Proxyfleet-Attempts header value for n.
func attemptsValue(n int) []string {
	if n >= 0 && n < len(attemptsValues) {
		return attemptsValues[n]
	}
	return []string{strconv.Itoa(n)}
}

// finish ends a request the gateway answers itself, or that the client
// left: the one exit of every failure. judge decides; finish reports or
// releases the lease still held, writes the answer and records the metric,
// so no exit can forget one of them. A request that gets no answer (the
// client is gone) ends its connection instead of letting the server write
// a default one.
func (f *finisher) finish(ctx context.Context, rq *request, err error) {
	rq.leavePace(f.pace)
	v := judge(err)
	if rq.h.mc != nil {
		if v.report != "" {
			f.leases.drop(ctx, rq.lr, rq.h, v.report, 0)
			if v.report == rotation.ResultUpstreamFailed {
				f.health.MemberFailed(rq.h.health(), fault.Of(err).F.Class)
			}
		} else {
			f.leases.done(ctx, rq.h)
		}
		rq.h = held{}
	}
	if v.reason != "" {
		h := rq.w.Header()
		switch v.reason {
		case fault.ReasonAuth, fault.ReasonBadParams:
			h.Set("Proxy-Authenticate", `Basic realm="proxyfleet"`)
		case fault.ReasonNoMember:
			// When every member rests for the site the pool says when the
			// first is back; else (one unhealthy or at capacity, which may
			// end any moment) a second.
			retry := int64(1)
			if nm := (*pool.NoMatchError)(nil); errors.As(err, &nm) && nm.RetryAfterSeconds > 1 {
				retry = nm.RetryAfterSeconds
			}
			h.Set("Retry-After", strconv.FormatInt(retry, 10))
		case fault.ReasonQuota:
			if ref := (*quota.Refusal)(nil); errors.As(err, &ref) {
				h.Set("Retry-After", strconv.FormatInt(ref.RetryAfterSeconds(), 10))
			}
		case fault.ReasonOverloaded:
			h.Set("Retry-After", "1")
			f.log.Warn("the gateway could not open a connection: raise its open-file limit or spread the load", "err", err)
		case fault.ReasonInternal:
			// An error no rule of judge knows: a bug, so it is said where
			// an operator looks, not only in the client's answer.
			f.log.Error("internal failure: the request was answered 500; please report this", "err", err)
		case fault.ReasonPaced:
			var pe *pacing.Error
			if errors.As(err, &pe) {
				h.Set("Retry-After", strconv.FormatInt(int64(max(1, (pe.RetryAfter+time.Second-1)/time.Second)), 10))
			}
		}
		if rq.nameHdr != nil {
			h[HeaderProxy] = rq.nameHdr
		}
		if rq.attempts > 0 {
			h[HeaderAttempts] = attemptsValue(rq.attempts)
		}
		if v.closeConn {
			h.Set("Connection", "close")
		}
		f.fail(rq.w, v.reason, err.Error())
	}
	f.ended(ctx, rq, v.outcome, v.reason)
	if v.reason == "" {
		panic(http.ErrAbortHandler)
	}
}

// fail writes an answer the gateway itself produced: a text body saying
// what is wrong, X-Proxyfleet-Reason with a short cause and Proxy-Status
// with its RFC 9209 type (fault.ProxyStatusError).
func (f *finisher) fail(w http.ResponseWriter, reason, msg string) {
	status, _ := answerFor(reason)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set(HeaderReason, reason)
	h.Set("Proxy-Status", fault.ProxyStatus(reason))
	w.WriteHeader(status)
	_, _ = w.Write([]byte("proxyfleet: " + msg + "\n"))
}

// attempts is a request's record of the members that failed it, and the
// rule for when to stop trying others.
type attempts struct {
	hostport string // the target, for messages
	tried    []string
	last     *fault.Attempt
	lastName string
	fails    fault.SiteFailures
}

// failed records ae, a failure of the lease h (already reported), and says
// whether the request must stop: the site failed the same way on a second
// member (then it is the site), or the retry budget for answers about the
// site is spent.
func (a *attempts) failed(h held, ae *fault.Attempt, retries int) (stop bool) {
	name := h.mc.Member.Name
	a.tried = append(a.tried, name)
	a.last, a.lastName = ae, name
	if ae.F.Fault == rotation.FaultSite {
		return a.fails.Add(name, h.id, ae.F, ae) || len(a.fails) > retries
	}
	return false
}

// triedBefore reports whether the pool offered a member that already
// failed this request (its failure window did not apply, e.g. a remote
// report was lost).
func (a *attempts) triedBefore(name string) bool { return slices.Contains(a.tried, name) }

// giveUp is the error that ends the request after its attempts; suffix
// says why no further member was tried.
func (a *attempts) giveUp(suffix string) error {
	if a.last.F.Fault == rotation.FaultSite {
		return &givenUp{last: a.last, msg: a.fails.Message(a.hostport) + suffix}
	}
	return &givenUp{last: a.last, msg: "upstream " + a.lastName + " failed: " + a.last.Error() + suffix}
}
