package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// classAnswerTimeout is the failure class of a member that did not answer
// an attempt within its answer timeout. One such silence is the site's (a
// member waits on a slow site as long as it must): the {member, site} pair
// rests, and two members silent on one site end the request. Whether the
// member itself is dead is asked separately (checkAlive).
const classAnswerTimeout = "answer_timeout"

// aliveTimeout bounds checkAlive's question (capped by DialTimeout): a
// proxy answers a request it needs no site for in milliseconds.
const aliveTimeout = 5 * time.Second

// errAnswerTimeout is the cause of an attempt its answer timeout ended.
var errAnswerTimeout = errors.New("member answer timeout")

// answerTimeoutFor is the answer timeout of an attempt to host.
func (g *Gateway) answerTimeoutFor(host string) time.Duration {
	if d, ok := g.siteTimeouts.For(host); ok {
		return d
	}
	return g.answerTimeout
}

// answerTimedOut is the verdict of an attempt whose member did not answer
// within d.
func answerTimedOut(d time.Duration, what string) error {
	return siteFault(rotation.Site(classAnswerTimeout), errors.New("gave no answer to "+what+" within "+d.String()))
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
func (g *Gateway) send(mirror *innerTunnel, mc *memberConn, out *http.Request, timeout time.Duration) (*http.Response, error) {
	if mirror != nil {
		return g.sendMirrored(mirror, mc, out, timeout)
	}
	if leanEligible(mc, out) {
		resp, err := mc.lean.roundTrip(out.Context(), out, mc.proxyAuth, timeout)
		if errors.Is(err, errAnswerTimeout) {
			return nil, answerTimedOut(timeout, "the request")
		}
		return resp, err
	}
	out = withOrder(out, mc)
	var st *siteTrace
	if out.URL.Scheme == "https" {
		// Over the gateway's own TLS to the site: what fails once the
		// request is written may be the site's answer (siteTrace).
		st = new(siteTrace)
		out = out.WithContext(httptrace.WithClientTrace(out.Context(), st.trace()))
	}
	if timeout == g.answerTimeout {
		// The default: the Transport's own ResponseHeaderTimeout, set to
		// it (newMemberConn), bounds the answer from the request's write,
		// with nothing made per attempt.
		resp, err := mc.transport.RoundTrip(out)
		if err != nil && isTimeout(err) && out.Context().Err() == nil {
			return nil, answerTimedOut(timeout, "the request")
		}
		if err != nil {
			return nil, st.verdict(out.Context(), err)
		}
		return resp, nil
	}
	// A site's own answer timeout: its attempts go through a copy of the
	// Transport without ResponseHeaderTimeout, bounded by a timer of their
	// own.
	actx, cancel := context.WithCancelCause(out.Context())
	at := attemptTimer{t: time.AfterFunc(g.dialTimeout+timeout, func() { cancel(errAnswerTimeout) })}
	tctx := actx
	if out.Body != nil && (out.ContentLength < 0 || out.ContentLength > maxReadAhead) {
		// A body that streams may take long to write: the answer's time
		// runs from when it is written. (One read ahead whole is written
		// at once, and a request without one too.)
		tctx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { at.restart(timeout) }})
	}
	resp, err := mc.siteTransport().RoundTrip(out.WithContext(tctx))
	if !at.stop() {
		// The timer fired (perhaps just as the head arrived: its body is
		// cut off with the attempt's context either way).
		if err == nil {
			_ = resp.Body.Close()
		}
		if out.Context().Err() == nil {
			return nil, answerTimedOut(timeout, "the request")
		}
	}
	if err != nil {
		cancel(nil)
		return nil, st.verdict(out.Context(), err)
	}
	// actx lives on with the body; it ends with the request's context.
	return resp, nil
}

// aliveSet keeps one aliveness check per member at a time.
type aliveSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (s *aliveSet) begin(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[name]; ok {
		return false
	}
	if s.m == nil {
		s.m = make(map[string]struct{})
	}
	s.m[name] = struct{}{}
	return true
}

func (s *aliveSet) end(name string) {
	s.mu.Lock()
	delete(s.m, name)
	s.mu.Unlock()
}

// checkAlive follows an answer timeout of h's member: in the background,
// it asks the member for something it answers without any site (aliveness
// below). A member that sends back nothing at all (a hung Squid, a frozen
// VM, a half-dead NAT) is broken, not waiting on a slow site: it is reported
// failed on h's lease (released but still reportable), so it is out for
// every site now, not after a minute of requests that each wait out their
// timeout. The request itself does not wait for the answer.
func (g *Gateway) checkAlive(ctx context.Context, h held, target string) {
	mc := h.mc
	if mc.m.Direct() || !g.alive.begin(mc.m.Name) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer g.alive.end(mc.m.Name)
		err := g.aliveness(mc)
		if err == nil {
			// It answers: if it rests for its own failures, that ends.
			if rec, ok := g.failed.take(mc.m.Name); ok {
				rctx, cancel := bgCtx(ctx)
				defer cancel()
				if err := g.pool.Report(rctx, rec.leaseID, pool.Report{Result: rotation.ResultAnswered}); err != nil {
					g.log.Debug("lease report failed", "lease", rec.leaseID, "result", string(rotation.ResultAnswered), "err", err)
				}
			}
			return
		}
		g.log.Warn("member answers nothing, not even a request it needs no site for: out of service for every site",
			"member", mc.m.Name, "lastTarget", target, "err", err)
		g.rec.UpstreamFailure(mc.m.Name)
		rctx, cancel := bgCtx(ctx)
		defer cancel()
		if err := g.pool.Report(rctx, h.id, pool.Report{Result: rotation.ResultUpstreamFailed, Target: target}); err != nil {
			g.log.Warn("lease report failed", "lease", h.id, "member", mc.m.Name, "result", string(rotation.ResultUpstreamFailed), "err", err)
		}
		g.memberFailed(h, classAnswerTimeout)
	}()
}

// aliveness asks mc for an answer that needs no site: an https:// member's
// TLS handshake, a SOCKS5 member's method choice, an http:// member's
// answer to an origin-form request (a forward proxy refuses it at once,
// 400 from Squid). Any byte back within aliveTimeout is alive. It is not a
// health probe (that fetches a URL through the member): it tells a member
// that is up and waiting on a site from one that is not there at all.
func (g *Gateway) aliveness(mc *memberConn) error {
	wait := min(aliveTimeout, g.dialTimeout)
	c, err := net.DialTimeout("tcp", mc.upstreamAddr, g.dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	switch {
	case mc.tlsConfig != nil:
		return tls.Client(c, mc.tlsConfig).Handshake()
	case mc.socks5:
		_, err = c.Write([]byte{5, 1, 0})
	default:
		_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: " + mc.upstreamAddr + "\r\nConnection: close\r\n\r\n"))
	}
	if err != nil {
		return err
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return errors.New("no answer within " + wait.String() + ": " + err.Error())
	}
	return nil
}
