package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

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
func upstreamAnswer(resp *http.Response) error {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		discard(resp)
		return memberFault("auth", errUpstreamAuth)
	}
	if resp.StatusCode < 400 {
		return nil
	}
	ue := upstreamErrorOf(resp.Header)
	if !ue.Marked() {
		return nil // the site's own error answer: delivered as it is
	}
	discard(resp)
	return &attemptError{f: rotation.UpstreamAnswer(resp.StatusCode, ue), err: &answerError{status: resp.StatusCode, line: quote(resp.Status), ue: ue}}
}

// errRequestTimeout is the cancel cause when Options.RequestTimeout passes.
var errRequestTimeout = errors.New("request timeout")

// serveForward forwards an absolute-URI request through a leased member,
// reads the answer as rotation feedback and retries idempotent requests on
// another member after a ban or an upstream failure.
func (g *Gateway) serveForward(w http.ResponseWriter, r *http.Request, p *Params, start time.Time) {
	u := r.URL
	if u.Host == "" || u.Scheme == "" {
		g.fail(w, http.StatusBadRequest, "bad_request",
			"this is a forward proxy: send an absolute URI (GET http://host/path) or CONNECT host:port")
		g.rec.Request("", OutcomeBadRequest, time.Since(start))
		return
	}
	defPort := "80"
	switch u.Scheme {
	case "http":
	case "https":
		defPort = "443"
	default:
		g.fail(w, http.StatusBadRequest, "bad_request", "unsupported scheme "+quote(u.Scheme)+": want http or https")
		g.rec.Request("", OutcomeBadRequest, time.Since(start))
		return
	}
	host, port, err := splitTarget(u.Host, defPort)
	if err != nil {
		g.targetFail(w, err, start)
		return
	}
	// RequestTimeout bounds everything up to the answer's head, retries
	// included; the body then streams for as long as it takes.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	deadline := time.AfterFunc(g.requestTimeout, func() { cancel(errRequestTimeout) })
	defer deadline.Stop()
	addrs, err := g.checkTarget(ctx, host, port)
	if err != nil {
		g.targetFail(w, err, start)
		return
	}
	if addrs != nil {
		ctx = context.WithValue(ctx, checkedKey{}, &checkedAddrs{host: host, addrs: addrs})
	}
	lr := g.newLeaseReq(p, rotation.HostKey(host))
	h, err := g.acquire(ctx, &lr)
	if err != nil {
		if r.Context().Err() != nil {
			g.rec.Request("", OutcomeClientError, time.Since(start))
			return
		}
		g.rec.Request("", g.poolError(w, &lr, err), time.Since(start))
		return
	}

	out := r.WithContext(ctx)
	out.RequestURI = ""
	out.Close = false
	out.Header = forwardHeader(r.Header)
	if r.ContentLength == 0 {
		out.Body = nil
	}
	retryable := rotation.Retryable(r.Method, r.ContentLength != 0)
	var fails siteFailures
	for attempt := 0; ; attempt++ {
		resp, err := h.mc.roundTrip(out)
		if err == nil && !h.mc.m.Direct() {
			err = upstreamAnswer(resp)
		}
		if err != nil {
			name := h.mc.m.Name
			var te *targetError
			switch {
			case errors.As(err, &te):
				g.done(ctx, h)
				g.targetFail(w, te, start)
				return
			case r.Context().Err() != nil:
				g.done(ctx, h)
				g.rec.Request(name, OutcomeClientError, time.Since(start))
				return
			case context.Cause(ctx) == errRequestTimeout:
				// The whole request ran out of time: a slow site is not the
				// member's failure, so nothing is reported.
				g.done(ctx, h)
				w.Header()[HeaderProxy] = h.mc.nameHdr
				g.fail(w, http.StatusGatewayTimeout, "timeout", "no answer from "+quote(u.Host)+" through "+name+" within "+g.requestTimeout.String())
				g.rec.Request(name, OutcomeUpstreamFailed, time.Since(start))
				return
			}
			if h.mc.m.Direct() {
				err = classifyDirect(err)
			}
			ae := failureOf(err)
			if ae.firsthand && ae.f.Fault == rotation.FaultSite {
				// The site itself failed (refused, reset, bad TLS): not the
				// egress address's fault, so nothing is reported or retried.
				g.done(ctx, h)
				w.Header()[HeaderProxy] = h.mc.nameHdr
				g.fail(w, http.StatusBadGateway, "target_unreachable", "cannot reach "+quote(u.Host)+" from "+name+": "+err.Error())
				g.rec.Request(name, OutcomeUpstreamFailed, time.Since(start))
				return
			}
			g.log.Debug("request through member failed", "member", name, "target", lr.target, "fault", ae.f.Class, "err", err)
			g.drop(ctx, &lr, h, ae.f.Result(), 0)
			// The same site failure on two members is the site's: no third.
			same := ae.f.Fault == rotation.FaultSite && fails.add(name, h.id, ae.f, err)
			suffix := ""
			if retryable && attempt < g.retries && !same {
				next, aerr := g.acquire(ctx, &lr)
				if aerr == nil {
					h = next
					continue
				}
				suffix = "; no other member: " + aerr.Error()
			}
			w.Header()[HeaderProxy] = h.mc.nameHdr
			if ae.f.Fault == rotation.FaultSite {
				g.fail(w, http.StatusBadGateway, "target_unreachable", fails.message(u.Host)+suffix)
			} else {
				g.fail(w, http.StatusBadGateway, "upstream_failed", "upstream "+name+" failed: "+err.Error()+suffix)
			}
			g.rec.Request(name, OutcomeUpstreamFailed, time.Since(start))
			return
		}

		if !deadline.Stop() {
			// The timeout fired just as the head arrived; the body would be cut.
			discard(resp)
			g.done(ctx, h)
			w.Header()[HeaderProxy] = h.mc.nameHdr
			g.fail(w, http.StatusGatewayTimeout, "timeout", "no answer from "+quote(u.Host)+" within "+g.requestTimeout.String())
			g.rec.Request(h.mc.m.Name, OutcomeUpstreamFailed, time.Since(start))
			return
		}
		// The site answered through this member, whatever it said.
		g.reached(ctx, h.mc.m.Name, lr.target, fails)
		fails = nil
		res := g.classifier.Classify(resp.StatusCode)
		if res.IsBan() {
			var ra time.Duration
			if res == rotation.ResultRateLimited {
				if v := resp.Header["Retry-After"]; len(v) > 0 {
					ra, _ = rotation.ParseRetryAfter(v[0], time.Now())
				}
			}
			g.drop(ctx, &lr, h, res, ra)
			if retryable && attempt < g.retries {
				if next, aerr := g.acquire(ctx, &lr); aerr == nil {
					discard(resp)
					h = next
					deadline.Reset(g.requestTimeout - time.Since(start))
					continue
				}
			}
			if !g.deliver(w, r, resp, h, res, start) {
				panic(http.ErrAbortHandler)
			}
			return
		}
		g.succeeded(ctx, &lr, h)
		ok := g.deliver(w, r, resp, h, res, start)
		g.done(ctx, h)
		if !ok {
			// The upstream broke off mid-body. Abort the client's answer so
			// it sees a truncated response, not a complete one.
			panic(http.ErrAbortHandler)
		}
		return
	}
}

// deliver streams resp to the client with the gateway's headers added. It
// returns false when the upstream broke off mid-body.
func (g *Gateway) deliver(w http.ResponseWriter, r *http.Request, resp *http.Response, h held, res rotation.Result, start time.Time) bool {
	defer resp.Body.Close()
	name := h.mc.m.Name
	dst := w.Header()
	copyResponseHeader(dst, resp.Header)
	if _, ok := resp.Header["Content-Type"]; !ok {
		// A nil value stops net/http from sniffing one: the client must see
		// the site's answer, not a Content-Type the gateway guessed.
		dst["Content-Type"] = nil
	}
	dst[HeaderProxy] = h.mc.nameHdr
	dst[HeaderLease] = []string{h.id}
	w.WriteHeader(resp.StatusCode)
	g.rec.Request(name, string(res), time.Since(start))
	if r.ContentLength > 0 {
		g.rec.BytesRelayed(DirectionUp, r.ContentLength)
	}

	bp := g.bufs.get()
	defer g.bufs.put(bp)
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
			g.rec.BytesRelayed(DirectionDown, n)
			g.log.Debug("answer body broke off", "member", name, "err", rerr)
			return false
		}
	}
	g.rec.BytesRelayed(DirectionDown, n)
	for k, vv := range resp.Trailer {
		dst[http.TrailerPrefix+k] = vv
	}
	return true
}

// discard drains a little of an answer we will not deliver, so its
// keep-alive connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, maxDiscard)
	_ = resp.Body.Close()
}

// isHopByHop reports headers that belong to one connection (RFC 9110 7.6.1)
// or to the client↔proxy hop, in canonical form.
func isHopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// namedByConnection reports whether Connection lists header k.
func namedByConnection(conn []string, k string) bool {
	for _, v := range conn {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(tok), k) {
				return true
			}
		}
	}
	return false
}

// forwardHeader copies the request headers that travel on: no hop-by-hop
// header, nothing Connection names, no X-Proxyfleet-* header. Value slices
// are shared, not copied; neither side modifies them.
func forwardHeader(in http.Header) http.Header {
	out := make(http.Header, len(in))
	conn := in["Connection"]
	for k, vv := range in {
		if isHopByHop(k) || strings.HasPrefix(k, headerPrefix) || (len(conn) > 0 && namedByConnection(conn, k)) {
			continue
		}
		out[k] = vv
	}
	return out
}

// copyResponseHeader copies an answer's end-to-end headers into dst; a
// site's own X-Proxyfleet-* headers are dropped so they cannot pose as ours.
func copyResponseHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if isHopByHop(k) || strings.HasPrefix(k, headerPrefix) || (len(conn) > 0 && namedByConnection(conn, k)) {
			continue
		}
		dst[k] = vv
	}
}
