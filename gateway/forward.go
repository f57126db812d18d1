package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/answerbody"
	"github.com/proxyfleet/proxyfleet/gateway/clientbody"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/hop"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// maxReadAhead is how much of a request body is taken in before a member
// is leased (clientbody.Body.ReadAhead).
const maxReadAhead = 64 << 10

// maxDiscard is how much of a retried answer's body is read to keep its
// connection reusable; a longer body closes the connection instead.
const maxDiscard = 64 << 10

// errUpstreamAuth is a plain-HTTP answer 407 from an upstream member: its
// credentials are wrong, which is the member's failure, not the site's.
var errUpstreamAuth = errors.New("answered 407 Proxy Authentication Required (the member's credentials are wrong)")

// upstreamAnswer returns nil when resp is the site's answer, and a
// classified failure when the upstream made it itself: a 407 to our
// credentials, or an error answer carrying a proxy's error header
// (X-Squid-Error, Proxy-Status, ...). Such an answer is consumed.
//
// Only an answer proxyWroteAnswer says the member could have written is
// asked: a site's own 407 or Proxy-Status over TLS is the site's.
func upstreamAnswer(resp *http.Response) error {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		discard(resp)
		return fault.Member("auth", errUpstreamAuth)
	}
	if resp.StatusCode < 400 {
		return nil
	}
	ue := link.UpstreamErrorOf(resp.Header)
	if !ue.Marked() {
		return nil // the site's own error answer: delivered as it is
	}
	discard(resp)
	return &fault.Attempt{F: rotation.UpstreamAnswer(resp.StatusCode, ue), Err: &fault.Answer{Status: resp.StatusCode, Line: echo.Quote(resp.Status), UE: ue}}
}

// proxyWroteAnswer reports whether the member, not the site, may have
// written out's answer: only an HTTP proxy member sent a plain http:// URL
// in absolute form reads the request and answers it itself. An https:// URL
// (the Transport's CONNECT, or a MITM'd tunnel's site link) is answered over
// the gateway's own TLS to the site, which the member only relays; a socks5
// member relays bytes and never answers in HTTP; a direct member is the
// site. Reading a site's 503 "Proxy-Status: CDN; error=connection_limit_reached"
// or its 407 as the member's rested every member for every site.
func proxyWroteAnswer(rq *request, mc *link.Link, out *http.Request) bool {
	return !mc.Member.Direct() && !mc.SOCKS5 && rq.mirror == nil && out.URL.Scheme == "http"
}

// serveForward forwards an absolute-URI request through a leased member,
// reads the answer as rotation feedback and retries idempotent requests on
// another member after a ban or an upstream failure.
func (rp *requestPath) serveForward(w http.ResponseWriter, r *http.Request, p *params.Params, start time.Time) {
	rq := &request{w: w, start: start}
	u := r.URL
	if u.Host == "" || u.Scheme == "" {
		rp.exit.finish(r.Context(), rq, &fault.Target{Reason: fault.ReasonBadRequest,
			Msg: "this is a forward proxy: send an absolute URI (GET http://host/path) or CONNECT host:port"})
		return
	}
	defPort := "80"
	switch u.Scheme {
	case "http":
	case "https":
		defPort = "443"
	case "ws", "wss":
		// WebSocket clients (aiohttp, websocat) name the socket's own
		// scheme in the request line: the same request as http(s).
		if u.Scheme == "wss" {
			u.Scheme, defPort = "https", "443"
		} else {
			u.Scheme = "http"
		}
	default:
		rp.exit.finish(r.Context(), rq, &fault.Target{Reason: fault.ReasonBadRequest, Msg: "unsupported scheme " + echo.Quote(u.Scheme) + ": want http, https, ws or wss"})
		return
	}
	host, port, err := sites.SplitTarget(u.Host, defPort)
	if err != nil {
		rp.exit.finish(r.Context(), rq, err)
		return
	}
	rp.forward(rq, r, p, r.URL, host, port)
}

// forward is the request path every forwarded request shares, plain HTTP
// and requests inside a MITM tunnel alike: check the target, lease, send
// through the member with retries, classify, deliver. u is the absolute
// URL to send (host and port already split from it).
func (rp *requestPath) forward(rq *request, r *http.Request, p *params.Params, u *url.URL, host string, port uint16) {
	w, start := rq.w, rq.start
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		rq.body = clientbody.New(r, r.Body)
	}
	// RequestTimeout bounds everything up to the answer's head, retries
	// included; the body then streams for as long as it takes.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	deadline := time.AfterFunc(rp.requestTimeout, func() {
		if rq.body.Stalled() {
			// The forwarding waits on the client's body: cut the read off,
			// or the Transport, which waits for its body writer to end,
			// would wait on the client for as long as it pleases.
			_ = http.NewResponseController(rq.w).SetReadDeadline(keepalive.ALongTimeAgo)
		}
		cancel(errRequestTimeout)
	})
	defer deadline.Stop()
	rq.pace.Due = start.Add(rp.requestTimeout)
	rq.pace.Trail = true // its answer is seen: it trails the site's leader
	addrs, err := rp.admit.CheckTarget(ctx, host, port)
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	if addrs != nil {
		ctx = link.WithChecked(ctx, host, addrs)
	}
	if rq.body != nil {
		if cf := rq.body.ReadAhead(maxReadAhead); cf != nil {
			rp.exit.finish(ctx, rq, cf)
			return
		}
	}
	rq.lr = rp.leases.newReq(p, rotation.HostKey(host))
	// The request holds its place in the site's pace until it ends.
	defer rq.leavePace(rp.pacer)

	out := r.WithContext(ctx)
	out.URL = u
	out.RequestURI = ""
	out.Close = false
	out.Header = hop.ForwardHeader(r.Header)
	out.Body = nil
	if rq.body != nil {
		out.Body = rq.body
		if n, ok := rq.body.Whole(); ok {
			// Known whole: sent with its length, whatever framing it came in.
			out.ContentLength, out.TransferEncoding = n, nil
		}
	}
	if isWebSocket(r) && rq.body == nil {
		rp.serveUpgrade(ctx, rq, r, out, host, port)
		return
	}
	resp, h, res, err := rp.forwardWithRetry(ctx, r, rq, out, deadline)
	if err != nil {
		rp.exit.finish(ctx, rq, err)
		return
	}
	if res.IsBan() {
		// The ban was reported and the lease let go; the client gets the
		// site's answer.
		ok := rp.deliver(w, r, resp, h, res, rq.attempts, start, rq.lr.p.Client)
		rp.exit.trace(ctx, rq, outcomeOf(res), "")
		if !ok {
			panic(http.ErrAbortHandler)
		}
		return
	}
	rp.leases.succeeded(ctx, &rq.lr, h)
	ok := rp.deliver(w, r, resp, h, res, rq.attempts, start, rq.lr.p.Client)
	rp.leases.done(ctx, h)
	rp.exit.trace(ctx, rq, outcomeOf(res), "")
	if !ok {
		// The upstream broke off mid-body. Abort the client's answer so
		// it sees a truncated response, not a complete one.
		panic(http.ErrAbortHandler)
	}
}

// forwardWithRetry is plain HTTP on the one retry loop (tryMembers): send
// out through a member, and replay an idempotent request on another member
// after a failure judge allows retrying or a ban answer, up to
// Options.Retries. It returns the answer to deliver with its lease and
// classification (a ban's lease is already reported and released), or the
// error that ends the request, with rq holding the lease still in use.
func (rp *requestPath) forwardWithRetry(ctx context.Context, r *http.Request, rq *request, out *http.Request, deadline *time.Timer) (*http.Response, held, rotation.Result, error) {
	rule := retryRule{retryable: rotation.Retryable(r.Method, r.ContentLength != 0), maxRetries: rp.retries, method: r.Method}
	answerTimeout := rp.ex.answerTimeoutFor(rq.lr.target)
	at := attempts{hostport: out.URL.Host}
	var (
		resp *http.Response
		used held
		res  rotation.Result
	)
	err := rp.tryMembers(ctx, r.Context(), rq, &at, rule, func(h held, attempt int) (served, error) {
		got, ans, err := rp.forwardOnce(ctx, r, rq, out, h, deadline, answerTimeout)
		if err != nil {
			return tryAnother, err
		}
		resp, used, res = got, h, rp.classifier.ClassifyAnswer(ans)
		// Before anything else is sent: a ban cuts the site's pace now,
		// and counts toward its climb to the next tier.
		rp.pacer.Answered(&rq.pace, rq.lr.target, rq.member, res)
		rp.tierAnswered(ctx, rq, h, res)
		if !res.IsBan() {
			return servedHere, nil
		}
		rp.leases.drop(ctx, rq.lr, h, res, siteRetryAfter(res, resp.Header))
		rq.h = held{}
		if rq.lr.p.Strict {
			discard(resp)
			return tryAnother, rp.leases.lostSession(rq, h, "was banned by the site ("+strconv.Itoa(resp.StatusCode)+", "+string(res)+")")
		}
		if rule.retryable && attempt < rp.retries {
			// Leased before the banned answer is let go: with no other
			// member, the client gets the site's answer, not an error.
			if n, err := rp.acquireNext(ctx, rq); err == nil {
				discard(resp)
				rq.next = n
				deadline.Reset(rp.requestTimeout - time.Since(rq.start))
				return tryAnother, nil
			}
		}
		return servedHere, nil
	})
	if err != nil {
		return nil, held{}, "", err
	}
	return resp, used, res, nil
}

// classBodyBroke is the failure of an answer that broke off between its
// head and its first body byte (answerbody.Start).
const classBodyBroke = "answer broke off"

// forwardOnce sends out through h's member and reads the answer as far as
// the classifier needs it. Its error is classified for judge: the client's
// body, the request deadline, the site's certificate, a direct member's
// dial, or the member's.
func (rp *requestPath) forwardOnce(ctx context.Context, r *http.Request, rq *request, out *http.Request, h held, deadline *time.Timer, answerTimeout time.Duration) (*http.Response, rotation.Answer, error) {
	resp, err := rp.ex.send(rq.mirror, h.mc, out, answerTimeout)
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		// Nothing forwarded here asks for an upgrade (a WebSocket
		// handshake goes to serveUpgrade, any other Upgrade is dropped as
		// hop-by-hop): relayed, the client would read the site's next bytes
		// as its answer. Refused as the lean path refuses it.
		_ = resp.Body.Close()
		resp, err = nil, keepalive.ErrSwitched
	}
	if errors.Is(err, keepalive.ErrSwitched) {
		// The site's (certain over the gateway's own TLS to it or from a
		// direct member's address), as any answer it should not have sent.
		err = &fault.Attempt{F: rotation.Site(sitelink.ClassProtocol), Err: err, Firsthand: out.URL.Scheme == "https" || h.mc.Member.Direct()}
	}
	if cf := rq.body.Fault(); cf != nil {
		// The client botched its body: whatever the member made of the
		// cut request, it is the client's (a Transport may also have
		// raced the body's error with an answer).
		if err == nil {
			_ = resp.Body.Close()
		}
		return nil, rotation.Answer{}, cf
	}
	if err == nil && proxyWroteAnswer(rq, h.mc, out) {
		err = upstreamAnswer(resp)
	}
	var ans rotation.Answer
	if err == nil {
		// Read under the request deadline: a site that trickles its
		// challenge page cannot hold the request past it.
		ans, err = rp.ex.readAnswer(r, resp)
	}
	if err == nil && !deadline.Stop() {
		// The timeout fired just as the head arrived; the body would be cut.
		discard(resp)
		err = errRequestTimeout
	}
	if err == nil {
		if err = answerbody.Start(resp); err != nil {
			// The deadline stopped at the head; the next attempt needs it.
			deadline.Reset(rp.requestTimeout - time.Since(rq.start))
			// Through a member, the site or the member broke it off: the
			// pair rests, and two members failing the site alike make it
			// the site's, as a missing head does. A member killed is found
			// by its probes; a site that resets its answers rests no
			// member for every other site.
			err = &fault.Attempt{F: rotation.Site(classBodyBroke), Err: fmt.Errorf("broke off its answer after the head: %w", err), Firsthand: h.mc.Member.Direct()}
		}
	}
	switch {
	case err == nil:
		return resp, ans, nil
	case r.Context().Err() != nil:
		return nil, ans, fault.ErrClientGone
	case errors.Is(err, errRequestTimeout) || context.Cause(ctx) == errRequestTimeout:
		if rq.body.Stalled() {
			return nil, ans, &fault.Client{Reason: fault.ReasonClientTimeout, Outcome: fault.ReasonClientTimeout,
				Err: errors.New("the request body stopped arriving: " + strconv.FormatInt(rq.body.BytesRead(), 10) + " bytes within " + rp.requestTimeout.String())}
		}
		return nil, ans, &fault.Annotated{Err: errRequestTimeout,
			Msg: "no answer from " + echo.Quote(out.URL.Host) + " through " + rq.member + " within " + rp.requestTimeout.String()}
	}
	err = classifySiteTLS(err, h.mc, out.URL)
	if h.mc.Member.Direct() {
		err = link.ClassifyDirect(err)
	}
	return nil, ans, fault.AsAttempt(err)
}

// deliver streams resp to the client with the gateway's headers added. It
// returns false when the upstream broke off mid-body.
func (rp *requestPath) deliver(w http.ResponseWriter, r *http.Request, resp *http.Response, h held, res rotation.Result, attempts int, start time.Time, client string) bool {
	defer resp.Body.Close()
	name := h.mc.Member.Name
	dst := w.Header()
	hop.CopyResponseHeader(dst, resp.Header)
	if _, ok := resp.Header["Content-Type"]; !ok {
		// A nil value stops net/http from sniffing one: the client must see
		// the site's answer, not a Content-Type the gateway guessed.
		dst["Content-Type"] = nil
	}
	dst[HeaderProxy] = h.mc.NameHdr
	dst[HeaderLease] = []string{h.id}
	dst[HeaderAttempts] = attemptsValue(attempts)
	if t := rp.tiers.Header(h.mc.Member.Attributes); t != nil {
		dst[HeaderTier] = t
	}
	w.WriteHeader(resp.StatusCode)
	rp.rec.Request(name, outcomeOf(res), time.Since(start))

	bp := rp.bufs.Get()
	defer rp.bufs.Put(bp)
	buf := *bp
	flusher, _ := w.(http.Flusher)
	stream := resp.ContentLength < 0 && flusher != nil
	var n int64
	for {
		nr, rerr := resp.Body.Read(buf)
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				break // the client left; its connection is gone anyway
			}
			if stream {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			rp.relayed(r.Context(), client, max(r.ContentLength, 0), n)
			rp.log.Debug("answer body broke off", "member", name, "err", rerr)
			return false
		}
	}
	rp.relayed(r.Context(), client, max(r.ContentLength, 0), n)
	conn := resp.Header["Connection"]
	for k, vv := range resp.Trailer {
		// The same filter as the head's: a site's trailer cannot pose as
		// the gateway's X-Proxyfleet-* headers either.
		if hop.EndToEnd(k, conn) {
			dst[http.TrailerPrefix+k] = vv
		}
	}
	return true
}

// discard drains a little of an answer we will not deliver, so its
// keep-alive connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, maxDiscard)
	_ = resp.Body.Close()
}
