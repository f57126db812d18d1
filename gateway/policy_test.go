package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/admission"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/quota"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestJudgeTurnsEveryFailureIntoOneAnswer(t *testing.T) {
	site := &fault.Attempt{F: rotation.Site("dns"), Err: errors.New("answered CONNECT with 503")}
	member := &fault.Attempt{F: rotation.Member("dial"), Err: errors.New("connection refused")}
	tests := []struct {
		name    string
		err     error
		status  int
		reason  string
		outcome string
		report  rotation.Result
		retry   bool
	}{
		{"the client left: no answer, nothing reported", fault.ErrClientGone, 0, "", fault.OutcomeClientGone, "", false},
		{"a malformed body is the client's 400, whatever the round trip wrapped it in", fmt.Errorf("write: %w", fault.ClientRead(errors.New("invalid byte in chunk length"), 0)), 400, fault.ReasonBadRequest, fault.ReasonBadRequest, "", false},
		{"a body cut short is the client's: an answer is still tried, counted as gone", fault.ClientRead(io.ErrUnexpectedEOF, 2), 400, fault.ReasonBadRequest, fault.OutcomeClientGone, "", false},
		{"a client that stalls mid-body is 408", fault.ClientRead(os.ErrDeadlineExceeded, 2), 408, fault.ReasonClientTimeout, fault.ReasonClientTimeout, "", false},
		{"a client that reset mid-body gets nothing", fault.ClientRead(&net.OpError{Op: "read", Err: syscall.ECONNRESET}, 2), 0, "", fault.OutcomeClientGone, "", false},
		{"a client fault inside a member's attempt error is still the client's", &fault.Attempt{F: rotation.Member("error"), Err: fault.ClientRead(errors.New("malformed chunked encoding"), 0)}, 400, fault.ReasonBadRequest, fault.ReasonBadRequest, "", false},
		{"a wrong token is 407 auth", &admission.AuthError{Err: errors.New("x")}, 407, fault.ReasonAuth, fault.ReasonAuth, "", false},
		{"bad parameters are 407 bad_params", &params.Error{Msg: "x"}, 407, fault.ReasonBadParams, fault.ReasonBadParams, "", false},
		{"a malformed credential the token check refused is 407 auth", &admission.AuthError{Err: &params.Error{Msg: "x"}}, 407, fault.ReasonAuth, fault.ReasonAuth, "", false},
		{"a malformed target is 400", &fault.Target{Reason: fault.ReasonBadRequest}, 400, fault.ReasonBadRequest, fault.ReasonBadRequest, "", false},
		{"a private target is 403", &fault.Target{Reason: fault.ReasonPrivateTarget}, 403, fault.ReasonPrivateTarget, fault.ReasonPrivateTarget, "", false},
		{"the gateway itself is 508", &fault.Target{Reason: fault.ReasonLoop}, 508, fault.ReasonLoop, fault.ReasonLoop, "", false},
		{"our own lookup failing is 502 dns", &fault.Target{Reason: fault.ReasonDNS}, 502, fault.ReasonDNS, fault.ReasonDNS, "", false},
		{"the request deadline is 504 and no member's fault", &fault.Annotated{Err: errRequestTimeout, Msg: "slow"}, 504, fault.ReasonTimeout, fault.ReasonTimeout, "", false},
		{"draining is 503", errShuttingDown, 503, fault.ReasonShuttingDown, fault.ReasonShuttingDown, "", false},
		{"a new session beyond the limit is 503 session_limit, nothing leased", &sessionLimitError{max: 3}, 503, fault.ReasonSessionLimit, fault.ReasonSessionLimit, "", false},
		{"a client past its quota is 429 quota_exceeded, nothing leased or blamed", &quotaError{client: "a", ref: &quota.Refusal{Which: quota.WhichRPS, Limit: 2}}, 429, fault.ReasonQuota, fault.ReasonQuota, "", false},
		{"a member's answer about the site is reported as such and retried", site, 502, fault.ReasonTargetUnreachable, fault.ReasonTargetUnreachable, rotation.ResultTargetUnreachable, true},
		{"a member's own failure is member-wide and retried", member, 502, fault.ReasonUpstreamFailed, fault.ReasonUpstreamFailed, rotation.ResultUpstreamFailed, true},
		{"wrapped attempt failures keep their verdict", fmt.Errorf("dial: %w", member), 502, fault.ReasonUpstreamFailed, fault.ReasonUpstreamFailed, rotation.ResultUpstreamFailed, true},
		{"a direct member's own dial to a dead site ends it unreported", &fault.Attempt{F: rotation.Site("connect"), Err: errors.New("refused"), Firsthand: true}, 502, fault.ReasonTargetUnreachable, fault.ReasonTargetUnreachable, "", false},
		{"a site certificate the gateway could not verify is 502 site_certificate, unreported, not retried", &fault.Attempt{F: rotation.Site(fault.ClassCertificate), Err: errors.New("x509"), Firsthand: true}, 502, fault.ReasonSiteCertificate, fault.ReasonSiteCertificate, "", false},
		{"giving up after site answers is target_unreachable", &givenUp{last: site, msg: "m"}, 502, fault.ReasonTargetUnreachable, fault.ReasonTargetUnreachable, "", false},
		{"a member silent past its answer timeout rests the pair and is retried", fault.AnswerTimedOut(time.Second, "the request"), 504, fault.ReasonMemberTimeout, fault.ReasonMemberTimeout, rotation.ResultTargetUnreachable, true},
		{"giving up after members silent past the answer timeout is 504 member_timeout", &givenUp{last: fault.Of(fault.AnswerTimedOut(time.Second, "CONNECT")), msg: "m"}, 504, fault.ReasonMemberTimeout, fault.ReasonMemberTimeout, "", false},
		{"giving up after member failures is upstream_failed", &givenUp{last: member, msg: "m"}, 502, fault.ReasonUpstreamFailed, fault.ReasonUpstreamFailed, "", false},
		{"no usable member is 503 no_member", &pool.NoMatchError{Considered: 3}, 503, fault.ReasonNoMember, fault.ReasonNoMember, "", false},
		{"no match annotated keeps its reason", &fault.Annotated{Err: &pool.NoMatchError{}, Msg: "no member named x"}, 503, fault.ReasonNoMember, fault.ReasonNoMember, "", false},
		{"the client's sessttl above the maximum is 407", &fault.Annotated{Err: pool.ErrTTLTooLong, Msg: "sessttl"}, 407, fault.ReasonBadParams, fault.ReasonBadParams, "", false},
		{"the gateway's own lease TTL above the maximum is 503 pool_error", &poolConfigError{err: errors.New("x")}, 503, fault.ReasonPoolError, fault.ReasonPoolError, "", false},
		{"an unreachable pool API is 503 pool_unreachable", fmt.Errorf("%w: dial", pool.ErrUnreachable), 503, fault.ReasonPoolUnreachable, fault.ReasonPoolUnreachable, "", false},
		{"any other pool failure is 503 pool_error", &fault.Annotated{Err: errLeaseFailed, Msg: "lease failed"}, 503, fault.ReasonPoolError, fault.ReasonPoolError, "", false},
		{"a pool API refusing the gateway's identity is 403 pool_forbidden, not retried", &fault.Annotated{Err: &leaseapi.APIError{Status: 403, Code: "forbidden", Message: "sa crawl/x may not"}, Msg: "refused"}, 403, fault.ReasonPoolForbidden, fault.ReasonPoolForbidden, "", false},
		{"the gateway out of descriptors is its own 503, no member reported or tried", &fault.Attempt{F: rotation.Member("dial"), Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}}, 503, fault.ReasonOverloaded, fault.ReasonOverloaded, "", false},
		{"the system out of descriptors, even behind a direct member's site verdict, is the gateway's", &fault.Attempt{F: rotation.Site("connect"), Err: os.NewSyscallError("socket", syscall.ENFILE), Firsthand: true}, 503, fault.ReasonOverloaded, fault.ReasonOverloaded, "", false},
		{"a connect(2) without buffer space is the gateway's too", fault.Member("dial", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ENOBUFS)}), 503, fault.ReasonOverloaded, fault.ReasonOverloaded, "", false},
		{"anything unforeseen is 500 internal", errors.New("hijack"), 500, fault.ReasonInternal, fault.ReasonInternal, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(tt.err)
			if v.reason != tt.reason || v.outcome != tt.outcome || v.report != tt.report || v.retry != tt.retry {
				t.Fatalf("judge = %+v, want reason %q outcome %q report %q retry %v", v, tt.reason, tt.outcome, tt.report, tt.retry)
			}
			if _, client := errors.AsType[*fault.Client](tt.err); client != v.closeConn {
				t.Fatalf("closeConn %v: only a client's fault closes the client's connection", v.closeConn)
			}
			if tt.reason != "" {
				if status, _ := answerFor(tt.reason); status != tt.status {
					t.Fatalf("status %d, want %d", status, tt.status)
				}
			}
		})
	}
}

func TestEveryReasonHasItsOwnAnswer(t *testing.T) {
	reasons := []string{fault.ReasonBadRequest, fault.ReasonPrivateTarget, fault.ReasonAuth, fault.ReasonBadParams, fault.ReasonDNS, fault.ReasonTargetUnreachable,
		fault.ReasonUpstreamFailed, fault.ReasonSiteCertificate, fault.ReasonNoMember, fault.ReasonPoolUnreachable, fault.ReasonPoolError, fault.ReasonPoolForbidden, fault.ReasonShuttingDown, fault.ReasonTimeout, fault.ReasonLoop, fault.ReasonClientTimeout, fault.ReasonMemberTimeout, fault.ReasonPaced, fault.ReasonSessionLost, fault.ReasonSessionLimit, fault.ReasonOverloaded, fault.ReasonQuota}
	for _, r := range reasons {
		if status, _ := answerFor(r); status == http.StatusInternalServerError {
			t.Errorf("reason %q falls through to 500", r)
		}
	}
	if got := outcomeOf(rotation.ResultRateLimited) + "," + outcomeOf(rotation.ResultBanned) + "," + outcomeOf(rotation.ResultOK); got != "rate_limited,banned,ok" {
		t.Errorf("delivered outcomes %s", got)
	}
}

// An error judge has no rule for is a bug: its 500 says so to the client
// and the log says so to the operator, who otherwise would never see it.
func TestAnInternalFailureIsAnsweredAndLogged(t *testing.T) {
	logs := &testutil.LockedBuffer{}
	e := newEnv(t, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}, pool.StoreOptions{})
	w := httptest.NewRecorder()
	e.gw.path.exit.finish(context.Background(), &request{w: w, start: time.Now()}, errors.New("an unforeseen failure"))
	if w.Code != http.StatusInternalServerError || w.Header().Get(HeaderReason) != fault.ReasonInternal {
		t.Fatalf("answered %d %q, want 500 %s", w.Code, w.Header().Get(HeaderReason), fault.ReasonInternal)
	}
	if !strings.Contains(w.Body.String(), "an unforeseen failure") {
		t.Errorf("the body %q does not say what failed", w.Body.String())
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "an unforeseen failure") {
		t.Errorf("the log does not carry the failure at error:\n%s", l)
	}
}

// When every member rests for a site, the 503 no_member says when the
// first is back (a crawler that honours Retry-After does not ask every
// second through a ten-minute ban); with one merely unhealthy it stays 1s.
func TestNoMemberSaysWhenTheFirstMemberIsBack(t *testing.T) {
	members := directMembers(2)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true, Retries: 1}, pool.StoreOptions{}, members...)
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.123"})
	site.SetRule(sourceOf(members[0]), http.StatusTooManyRequests, map[string]string{"Retry-After": "120"})
	site.SetRule(sourceOf(members[1]), http.StatusTooManyRequests, map[string]string{"Retry-After": "90"})
	c := e.client("", "")
	resp, _ := get(t, c, site.URL(), nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the first request: %d, want the site's 429 after both members", resp.StatusCode)
	}
	resp, _ = get(t, c, site.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != fault.ReasonNoMember {
		t.Fatalf("with both resting: %d %q, want 503 no_member", resp.StatusCode, resp.Header.Get(HeaderReason))
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 85 || ra > 90 {
		t.Fatalf("Retry-After %q, want about 90 (the first member back)", resp.Header.Get("Retry-After"))
	}
	e.store.SetHealth(members[1].Name, false, 0)
	resp, _ = get(t, c, site.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("with one unhealthy: %d Retry-After %q, want 503 with 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// A gateway whose member is another proxyfleet gateway reads that
// gateway's own answers by their Proxy-Status: a 503 no_member from it is
// not the site's answer to relay but that member unable to reach the
// site, so the request goes on through another member.
func TestAChainedGatewaysOwnAnswerIsNotTheSites(t *testing.T) {
	inner := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	inner.store.SetHealth(directMembers(1)[0].Name, false, 0) // every request: 503 no_member
	direct := directMembers(2)[1]
	outer := newEnv(t, Options{Mode: rotation.ModeRequest, AllowPrivateTargets: true, Retries: 2}, pool.StoreOptions{},
		pool.Member{Name: "a-inner", URL: &url.URL{Scheme: "http", Host: inner.addr}},
		pool.Member{Name: "z-direct", SourceAddr: direct.SourceAddr})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.124"})
	resp, ans := get(t, outer.client("", ""), site.URL(), nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderProxy) != "z-direct" || resp.Header.Get(HeaderAttempts) != "2" {
		t.Fatalf("%d via %q (%s attempts, source %s), want 200 through z-direct after a-inner's no_member",
			resp.StatusCode, resp.Header.Get(HeaderProxy), resp.Header.Get(HeaderAttempts), ans.Source)
	}
}
