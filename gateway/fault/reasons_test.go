package fault

import (
	"net/http"
	"testing"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// Every answer the gateway makes names its RFC 9209 type, and a gateway
// that has this one as a member reads it as one gateway would blame:
// the site's failures stay the site's, the gateway's own trouble is that
// member's, and a refusal bound to a site or request rests only that site
// through it.
func TestProxyStatusTellsAChainedGatewayWhoseFailureItIs(t *testing.T) {
	for _, tc := range []struct {
		reason string
		member bool // the member's failure (rest it for every site), else the site's through it
	}{
		{ReasonDNS, false}, {ReasonTargetUnreachable, false}, {ReasonSiteCertificate, false},
		{ReasonTimeout, false}, {ReasonMemberTimeout, false}, {ReasonPrivateTarget, false},
		{ReasonNoMember, false}, {ReasonPaced, false}, {ReasonSessionLost, false},
		{ReasonBadRequest, false},
		// A 407 is about the credentials the chaining gateway sent: its member's login.
		{ReasonAuth, true}, {ReasonBadParams, true},
		{ReasonUpstreamFailed, true}, {ReasonPoolUnreachable, true}, {ReasonPoolError, true},
		// A gateway its pool refuses serves no site: its own trouble.
		{ReasonPoolForbidden, true},
		{ReasonShuttingDown, true}, {ReasonSessionLimit, true}, {ReasonOverloaded, true}, {ReasonQuota, true},
		{ReasonLoop, true}, {ReasonInternal, true},
	} {
		status := AnswerStatus(tc.reason)
		f := rotation.UpstreamAnswer(status, rotation.UpstreamError{ProxyStatus: ProxyStatus(tc.reason)})
		if (f.Fault == rotation.FaultMember) != tc.member {
			t.Errorf("%s: a chained gateway reads %+v, want member fault %v", tc.reason, f, tc.member)
		}
		if !(rotation.UpstreamError{ProxyStatus: ProxyStatus(tc.reason)}).Marked() {
			t.Errorf("%s: Proxy-Status %q does not mark the answer as the gateway's own", tc.reason, ProxyStatus(tc.reason))
		}
	}
}

// Every reason the gateway answers with has a status of its own: none
// falls through to 500, which only ReasonInternal (and an unknown reason)
// gets.
func TestEveryReasonHasAStatusOfItsOwn(t *testing.T) {
	for _, r := range []string{ReasonBadRequest, ReasonClientTimeout, ReasonPrivateTarget, ReasonAuth, ReasonBadParams, ReasonDNS,
		ReasonTargetUnreachable, ReasonUpstreamFailed, ReasonSiteCertificate, ReasonNoMember, ReasonPoolUnreachable, ReasonPoolError,
		ReasonPoolForbidden, ReasonShuttingDown, ReasonPaced, ReasonSessionLost, ReasonSessionLimit, ReasonOverloaded, ReasonTimeout,
		ReasonMemberTimeout, ReasonLoop, ReasonQuota} {
		if AnswerStatus(r) == http.StatusInternalServerError {
			t.Errorf("reason %q falls through to 500", r)
		}
	}
	if AnswerStatus(ReasonInternal) != http.StatusInternalServerError || AnswerStatus("no_such_reason") != http.StatusInternalServerError {
		t.Error("an internal failure or an unknown reason is not 500")
	}
}
