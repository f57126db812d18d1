package hop

import (
	"net/http"
	"slices"
	"testing"
)

func TestForwardHeaderKeepsOnlyWhatTravelsOn(t *testing.T) {
	in := http.Header{
		"Connection":           {"keep-alive, X-Private"},
		"X-Private":            {"hop"},
		"Keep-Alive":           {"timeout=5"},
		"Proxy-Authorization":  {"Basic eDp5"},
		"Te":                   {"trailers"},
		"X-Proxyfleet-Session": {"s1"},
		"Accept":               {"*/*"},
		"Cookie":               {"a=1"},
	}
	out := ForwardHeader(in)
	var got []string
	for k := range out {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := []string{"Accept", "Cookie", "User-Agent"}; !slices.Equal(got, want) {
		t.Fatalf("forwarded fields %v, want %v", got, want)
	}
	if ua := out["User-Agent"]; len(ua) != 1 || ua[0] != "" {
		t.Fatalf("a request without a User-Agent goes on with %q, want one empty value (no writer adds its own)", ua)
	}
	if ua := ForwardHeader(http.Header{"User-Agent": {"crawler/1"}})["User-Agent"]; len(ua) != 1 || ua[0] != "crawler/1" {
		t.Fatalf("the client's User-Agent became %q", ua)
	}
}

func TestEndToEndDropsHopByHopNamedAndOwnFields(t *testing.T) {
	conn := []string{"close, X-Trace"}
	for _, tc := range []struct {
		field string
		want  bool
	}{
		{"Content-Type", true}, {"Set-Cookie", true},
		{"Transfer-Encoding", false}, {"Connection", false}, {"Proxy-Authenticate", false}, {"Upgrade", false},
		{"X-Trace", false},             // named by the answer's Connection
		{"X-Proxyfleet-Reason", false}, // only the gateway writes its own fields
	} {
		if got := EndToEnd(tc.field, conn); got != tc.want {
			t.Errorf("EndToEnd(%q) = %v, want %v", tc.field, got, tc.want)
		}
	}
	dst := http.Header{}
	CopyResponseHeader(dst, http.Header{"Content-Length": {"3"}, "Keep-Alive": {"x"}, "X-Proxyfleet-Lease": {"forged"}})
	if len(dst) != 1 || dst.Get("Content-Length") != "3" {
		t.Fatalf("copied answer fields %v, want Content-Length only", dst)
	}
}
