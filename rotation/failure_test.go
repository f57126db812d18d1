package rotation

import (
	"strings"
	"testing"
)

func TestUpstreamAnswerTellsMemberFromSite(t *testing.T) {
	tests := []struct {
		name   string
		status int
		ue     UpstreamError
		want   Failure
	}{
		{"407 is our credentials", 407, UpstreamError{}, Member("auth")},
		{"407 wins over a site error name", 407, UpstreamError{SquidError: "ERR_DNS_FAIL 0"}, Member("auth")},
		{"squid DNS failure", 503, UpstreamError{SquidError: "ERR_DNS_FAIL 0"}, Site("dns")},
		{"squid cannot forward (an unresolvable CONNECT)", 500, UpstreamError{SquidError: "ERR_CANNOT_FORWARD 0"}, Site("cannot_forward")},
		{"squid connect refused", 503, UpstreamError{SquidError: "ERR_CONNECT_FAIL 111"}, Site("connect")},
		{"squid policy refusal", 403, UpstreamError{SquidError: "ERR_ACCESS_DENIED 0"}, Site("access")},
		{"squid read timeout", 504, UpstreamError{SquidError: "ERR_READ_TIMEOUT 0"}, Site("timeout")},
		{"squid TLS to the site", 503, UpstreamError{SquidError: "ERR_SECURE_CONNECT_FAIL 0"}, Site("tls")},
		{"squid shutting down is the member", 503, UpstreamError{SquidError: "ERR_SHUTTING_DOWN 0"}, Member("shutting_down")},
		{"squid out of sockets is the member", 500, UpstreamError{SquidError: "ERR_SOCKET_FAILURE 24"}, Member("socket_failure")},
		{"squid proxy auth page is the member", 403, UpstreamError{SquidError: "ERR_CACHE_ACCESS_DENIED 0"}, Member("auth")},
		{"unknown squid code is the site", 502, UpstreamError{SquidError: "ERR_SOMETHING_NEW 0"}, Site("something_new")},
		{"garbled squid header is ignored", 503, UpstreamError{SquidError: "ERR_<script> 0"}, Site("status 503")},
		{"RFC 9209 dns_error", 502, UpstreamError{ProxyStatus: `gw.example; error=dns_error; rcode=NXDOMAIN`}, Site("dns")},
		{"RFC 9209 quoted and upper case", 502, UpstreamError{ProxyStatus: `gw; error="Connection_Refused"`}, Site("connect")},
		{"RFC 9209 last hop speaks", 502, UpstreamError{ProxyStatus: `far; error=proxy_internal_error, near; error=destination_ip_prohibited`}, Site("access")},
		{"RFC 9209 proxy trouble is the member", 502, UpstreamError{ProxyStatus: `gw; error=proxy_internal_error`}, Member("proxy_internal_error")},
		{"RFC 9209 connection limit is the member", 503, UpstreamError{ProxyStatus: `gw; error=connection_limit_reached`}, Member("connection_limit_reached")},
		{"RFC 9209 wins over squid", 502, UpstreamError{ProxyStatus: `gw; error=connection_timeout`, SquidError: "ERR_DNS_FAIL 0"}, Site("timeout")},
		{"RFC 9209 without error falls through", 502, UpstreamError{ProxyStatus: `gw; received-status=502`, SquidError: "ERR_DNS_FAIL 0"}, Site("dns")},
		{"bright data code", 502, UpstreamError{BrightDataCode: "client_10000"}, Site("brd client_10000")},
		{"bare 503 is the site", 503, UpstreamError{}, Site("status 503")},
		{"bare 502 is the site", 502, UpstreamError{}, Site("status 502")},
		{"bare 500 counts as the site (evidence catches a broken member)", 500, UpstreamError{}, Site("status 500")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := UpstreamAnswer(tt.status, tt.ue); got != tt.want {
				t.Fatalf("UpstreamAnswer(%d, %+v) = %+v, want %+v", tt.status, tt.ue, got, tt.want)
			}
		})
	}
}

func TestFailureResultIsMemberWideOnlyForMemberFaults(t *testing.T) {
	if r := Member("dial").Result(); r != ResultUpstreamFailed {
		t.Fatalf("member fault reports %q", r)
	}
	if r := Site("dns").Result(); r != ResultTargetUnreachable {
		t.Fatalf("site fault reports %q", r)
	}
}

func TestUpstreamErrorMarkedAndReason(t *testing.T) {
	tests := []struct {
		ue     UpstreamError
		marked bool
		reason string
	}{
		{UpstreamError{}, false, ""},
		{UpstreamError{SquidError: "ERR_DNS_FAIL 0"}, true, "X-Squid-Error ERR_DNS_FAIL"},
		{UpstreamError{SquidError: "not squid"}, false, ""},
		{UpstreamError{ProxyStatus: "gw; error=dns_error"}, true, "Proxy-Status error=dns_error"},
		{UpstreamError{ProxyStatus: "gw"}, false, ""},
		{UpstreamError{BrightDataCode: "client_10060"}, true, "x-brd-err-code client_10060"},
	}
	for _, tt := range tests {
		if m, r := tt.ue.Marked(), tt.ue.Reason(); m != tt.marked || r != tt.reason {
			t.Errorf("%+v: Marked %v Reason %q, want %v %q", tt.ue, m, r, tt.marked, tt.reason)
		}
	}
}

func TestSOCKSReplyClasses(t *testing.T) {
	tests := []struct {
		rep  byte
		want Failure
	}{
		{1, Site("socks5 reply 1")},
		{2, Site("access")},
		{3, Site("connect")},
		{4, Site("connect")},
		{5, Site("connect")},
		{6, Site("timeout")},
		{7, Member("socks5 reply 7")},
		{8, Member("socks5 reply 8")},
		{200, Site("socks5 reply 200")},
	}
	for _, tt := range tests {
		if got := SOCKSReply(tt.rep); got != tt.want {
			t.Errorf("SOCKSReply(%d) = %+v, want %+v", tt.rep, got, tt.want)
		}
	}
}

// FuzzUpstreamAnswer feeds upstream error headers (outside input): the
// verdict is always one of the two faults, and its class never carries
// anything but token characters into a message.
func FuzzUpstreamAnswer(f *testing.F) {
	f.Add(503, "gw; error=dns_error", "ERR_DNS_FAIL 0", "")
	f.Add(502, `a; error="x", b; error=connection_refused`, "", "client_10000")
	f.Add(407, "", "ERR_<>", "\r\n")
	f.Fuzz(func(t *testing.T, status int, ps, sq, brd string) {
		ue := UpstreamError{ProxyStatus: ps, SquidError: sq, BrightDataCode: brd}
		got := UpstreamAnswer(status, ue)
		if got.Fault != FaultMember && got.Fault != FaultSite {
			t.Fatalf("no fault: %+v", got)
		}
		if strings.ContainsAny(got.Class, "\r\n") || strings.ContainsAny(ue.Reason(), "\r\n") {
			t.Fatalf("control characters reach a message: %+v %q", got, ue.Reason())
		}
	})
}
