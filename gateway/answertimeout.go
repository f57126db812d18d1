package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
)

// answerTimeoutFor is the answer timeout of an attempt to host.
func (x *exchange) answerTimeoutFor(host string) time.Duration {
	if d, ok := x.siteTimeouts.For(host); ok {
		return d
	}
	return x.answerTimeout
}

// attemptTimer ends an attempt through the Transport when its member takes
// longer than the answer timeout. It runs from the attempt's start with the
// dial's time added (the Transport dials, and for an https:// URL makes its
// CONNECT and TLS, within the attempt), and again from when the request is
// written; stop fixes it, so a late WroteRequest cannot arm it again.
type attemptTimer struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func (a *attemptTimer) restart(d time.Duration) {
	a.mu.Lock()
	if !a.stopped {
		a.t.Reset(d)
	}
	a.mu.Unlock()
}

// stop disarms the timer and reports whether it had not fired.
func (a *attemptTimer) stop() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped = true
	return a.t.Stop()
}

// send makes one attempt of out through mc, its answer bounded by timeout:
// on the lean path by a read deadline, through the Transport by a context
// of the attempt's own (the request's context still bounds it all); a
// request of a mirroring MITM tunnel (mirror, else nil) on the tunnel's
// own site connection (sendMirrored). The answer's body streams under the
// request's context, unbounded.
func (x *exchange) send(mirror *innerTunnel, mc *link.Link, out *http.Request, timeout time.Duration) (*http.Response, error) {
	if mirror != nil {
		return x.sendMirrored(mirror, mc, out, timeout)
	}
	if link.LeanEligible(mc, out) {
		resp, err := mc.Lean.RoundTripLean(out.Context(), out, mc.ProxyAuth, timeout)
		if errors.Is(err, fault.ErrAnswerTimeout) {
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		return resp, err
	}
	out = link.WithOrder(out, mc)
	var st *sitelink.Trace
	if out.URL.Scheme == "https" {
		// Over the gateway's own TLS to the site: what fails once the
		// request is written may be the site's answer (siteTrace).
		st = new(sitelink.Trace)
		out = out.WithContext(httptrace.WithClientTrace(out.Context(), st.ClientTrace()))
	}
	if timeout == x.answerTimeout {
		// The default: the Transport's own ResponseHeaderTimeout, set to
		// it (newMemberConn), bounds the answer from the request's write,
		// with nothing made per attempt.
		resp, err := mc.Transport.RoundTrip(out)
		if err != nil && fault.IsTimeout(err) && out.Context().Err() == nil {
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
		if err != nil {
			return nil, st.Verdict(out.Context(), err)
		}
		return resp, nil
	}
	// A site's own answer timeout: its attempts go through a copy of the
	// Transport without ResponseHeaderTimeout, bounded by a timer of their
	// own.
	actx, cancel := context.WithCancelCause(out.Context())
	at := attemptTimer{t: time.AfterFunc(x.dialTimeout+timeout, func() { cancel(fault.ErrAnswerTimeout) })}
	tctx := actx
	if out.Body != nil && (out.ContentLength < 0 || out.ContentLength > maxReadAhead) {
		// A body that streams may take long to write: the answer's time
		// runs from when it is written. (One read ahead whole is written
		// at once, and a request without one too.)
		tctx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { at.restart(timeout) }})
	}
	resp, err := mc.SiteTransport().RoundTrip(out.WithContext(tctx))
	if !at.stop() {
		// The timer fired (perhaps just as the head arrived: its body is
		// cut off with the attempt's context either way).
		if err == nil {
			_ = resp.Body.Close()
		}
		if out.Context().Err() == nil {
			return nil, fault.AnswerTimedOut(timeout, "the request")
		}
	}
	if err != nil {
		cancel(nil)
		return nil, st.Verdict(out.Context(), err)
	}
	// actx lives on with the body; it ends with the request's context.
	return resp, nil
}
