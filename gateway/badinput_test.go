package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestBadRequestsGetA4xxAndChangeNothing sends malformed requests
// (oversized heads, malformed request lines, bad CONNECT targets) and checks
// each is a 4xx that takes no lease and never reaches the target.
func TestBadRequestsGetA4xxAndChangeNothing(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, directMembers(1)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	tests := []struct {
		name   string
		raw    string
		status int
	}{
		{name: "request head above 64 KiB is 431",
			raw:    "GET " + tg.URL() + "/big HTTP/1.1\r\nHost: " + tg.Addr() + "\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
			status: http.StatusRequestHeaderFieldsTooLarge},
		{name: "malformed request line is 400", raw: "GARBAGE\r\n\r\n", status: http.StatusBadRequest},
		{name: "an HTTP version other than 1.x is 505 (it was sent on as 1.1)",
			raw: "GET " + tg.URL() + "/v HTTP/3.7\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusHTTPVersionNotSupported},
		{name: "an HTTP/2.0 request line on an HTTP/1 connection is 505",
			raw: "GET " + tg.URL() + "/v HTTP/2.0\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusHTTPVersionNotSupported},
		{name: "CONNECT without a port is 400",
			raw: "CONNECT " + tg.Host() + " HTTP/1.1\r\nHost: " + tg.Host() + "\r\n\r\n", status: http.StatusBadRequest},
		{name: "CONNECT to port 0 is 400",
			raw: "CONNECT " + tg.Host() + ":0 HTTP/1.1\r\nHost: " + tg.Host() + ":0\r\n\r\n", status: http.StatusBadRequest},
		{name: "a target host that is neither an address nor a name is 400",
			raw: "GET http://a%2Fb.example/x HTTP/1.1\r\nHost: a%2Fb.example\r\n\r\n", status: http.StatusBadRequest},
		{name: "a CONNECT host with a byte no name has is 400",
			raw: "CONNECT a*b.example:443 HTTP/1.1\r\nHost: a*b.example:443\r\n\r\n", status: http.StatusBadRequest},
		{name: "a CONNECT target with a login is 400 (it was dropped and the tunnel opened)",
			raw: "CONNECT user:pw@" + tg.Addr() + " HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusBadRequest},
		{name: "a CONNECT target with a path is 400",
			raw: "CONNECT " + tg.Addr() + "/path HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusBadRequest},
		{name: "a CONNECT target with a query is 400",
			raw: "CONNECT " + tg.Addr() + "?x=1 HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusBadRequest},
		{name: "a CONNECT target with a %-escape is 400",
			raw: "CONNECT %31" + tg.Addr()[1:] + " HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusBadRequest},
		{name: "unsupported scheme is 400",
			raw: "GET ftp://" + tg.Addr() + "/x HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n\r\n", status: http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", e.addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write([]byte(tt.raw)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if n := e.store.ActiveLeases(); n != 0 {
				t.Fatalf("%d leases active after a refused request, want 0", n)
			}
			if n := tg.Total(); n != 0 {
				t.Fatalf("the target saw %d requests, want none", n)
			}
		})
	}
}

// X-Proxyfleet-Mitm is on or off: any other value is a 400 that opens no
// tunnel, never read as "intercept" (a client keeping a pinned site out
// with "false" had it intercepted), on a gateway with MITM or without.
func TestAnXProxyfleetMitmOtherThanOnOrOffIs400(t *testing.T) {
	ca, _ := newTestCA(t)
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	for name, o := range map[string]Options{
		"MITM":    {AllowPrivateTargets: true, MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintGo}},
		"no MITM": {AllowPrivateTargets: true},
	} {
		e := newEnv(t, o, pool.StoreOptions{}, directMembers(1)...)
		for _, tc := range []struct {
			values []string
			status int
		}{
			{[]string{"false"}, http.StatusBadRequest},
			{[]string{"no"}, http.StatusBadRequest},
			{[]string{"0"}, http.StatusBadRequest},
			{[]string{"off", "on"}, http.StatusBadRequest},
			{[]string{" OFF "}, http.StatusOK},
			{[]string{"on"}, http.StatusOK},
		} {
			c, resp, err := testutil.ConnectTunnel(e.addr, tg.Addr(), http.Header{HeaderMITM: tc.values}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if c != nil {
				c.Close()
			}
			if resp.StatusCode != tc.status {
				t.Errorf("%s: %s %q: %d, want %d", name, HeaderMITM, tc.values, resp.StatusCode, tc.status)
			}
			if tc.status == http.StatusBadRequest && resp.Header.Get(HeaderReason) != fault.ReasonBadRequest {
				t.Errorf("%s: %q: reason %q", name, tc.values, resp.Header.Get(HeaderReason))
			}
		}
	}
}
