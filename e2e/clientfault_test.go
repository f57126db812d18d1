package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// clientFaultCase is one malformed (or merely odd) request a client sends on
// a connection of its own.
type clientFaultCase struct {
	name string
	// raw is sent as it is; {T} is replaced by the target's host:port.
	raw string
	// then is what the client does after sending: "" keeps the connection
	// open and reads, "half-close" shuts its sending side and reads,
	// "hang-up" closes the connection without reading.
	then string
	// status is the first answer's status; 0 means no answer at all.
	status int
	// reason is the first answer's X-Proxyfleet-Reason ("" when relayed).
	reason string
	// closes: the gateway ends the connection after the first answer.
	closes bool
	// reachesTarget: the request (its first one) reaches the target.
	reachesTarget bool
}

// clientFaultCases are what real crawls and hostile clients send: each is
// refused as the client's fault (before a member is leased wherever the
// head shows it), or served as the RFCs allow, and none may take a member
// out of service.
var clientFaultCases = []clientFaultCase{
	{name: "a space before the colon of Transfer-Encoding is 400 before anything is leased",
		raw:    "POST http://{T}/te HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a header name with a space inside is 400 before anything is leased",
		raw:    "GET http://{T}/name HTTP/1.1\r\nHost: {T}\r\nX-Bad Name: 1\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a chunk size that is not hex is the client's 400",
		raw:    "POST http://{T}/zz HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a chunk size that overflows 64 bits is the client's 400",
		raw:    "POST http://{T}/big HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a chunk line ending in a bare LF is the client's 400",
		raw:    "POST http://{T}/lf HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a chunked body the client cuts short and half-closes is the client's 400",
		raw:  "POST http://{T}/cut HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe",
		then: "half-close", status: 400, reason: "bad_request", closes: true},
	{name: "a chunked body the client cuts short and hangs up on takes nothing out",
		raw:  "POST http://{T}/gone HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe",
		then: "hang-up"},
	{name: "a Content-Length body cut short is the client's 400",
		raw:  "POST http://{T}/short HTTP/1.1\r\nHost: {T}\r\nContent-Length: 10\r\n\r\nabc",
		then: "half-close", status: 400, reason: "bad_request", closes: true},
	{name: "two different Content-Lengths are 400",
		raw:    "POST http://{T}/cl2 HTTP/1.1\r\nHost: {T}\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		status: 400, reason: "bad_request", closes: true},
	{name: "Content-Length: 3, 3 is 400",
		raw:    "POST http://{T}/cl33 HTTP/1.1\r\nHost: {T}\r\nContent-Length: 3, 3\r\n\r\nabc",
		status: 400, reason: "bad_request", closes: true},
	{name: "an unknown Transfer-Encoding is 400",
		raw:    "POST http://{T}/gzip HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: gzip\r\n\r\nabc",
		status: 400, reason: "bad_request", closes: true},
	{name: "a stacked Transfer-Encoding is 400",
		raw:    "POST http://{T}/stack HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a NUL in a header value is 400",
		raw:    "GET http://{T}/nul HTTP/1.1\r\nHost: {T}\r\nX-A: a\x00b\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a head above 64 KiB is 431",
		raw:    "GET http://{T}/huge HTTP/1.1\r\nHost: {T}\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
		status: 431, reason: "bad_request", closes: true},
	{name: "a garbage request line is 400",
		raw:    "GARBAGE\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "an Expect the gateway does not know is 417",
		raw:    "POST http://{T}/expect HTTP/1.1\r\nHost: {T}\r\nExpect: 200-ok\r\nContent-Length: 3\r\n\r\nabc",
		status: 417, reason: "bad_request", closes: true},
	{name: "both Content-Length and Transfer-Encoding: framed by the chunks, answered, then the connection ends",
		raw:    "POST http://{T}/clte HTTP/1.1\r\nHost: {T}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET http://{T}/smuggled HTTP/1.1\r\nHost: {T}\r\n\r\n",
		status: 200, closes: true, reachesTarget: true},
	{name: "a folded header (obs-fold) is served with the fold replaced by a space",
		raw:    "GET http://{T}/fold HTTP/1.1\r\nHost: {T}\r\nX-Folded: a\r\n b\r\n\r\n",
		status: 200, reachesTarget: true},
	{name: "a head with bare LF line ends is served",
		raw:    "GET http://{T}/barelf HTTP/1.1\nHost: {T}\n\n",
		status: 200, reachesTarget: true},
	{name: "a chunked body with a trailer is served",
		raw:    "POST http://{T}/trailer HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n",
		status: 200, closes: true, reachesTarget: true},
	{name: "a trailer name with a space is the client's 400",
		raw:    "POST http://{T}/badtrailer HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Bad Sum: 1\r\n\r\n",
		status: 400, reason: "bad_request", closes: true},
	{name: "a body longer than its Content-Length: the request is served, the rest is a malformed next request",
		raw:    "POST http://{T}/long HTTP/1.1\r\nHost: {T}\r\nContent-Length: 3\r\n\r\nabcdefgh\r\n\r\n",
		status: 200, closes: true, reachesTarget: true},
}

// TestGatewayClientFaults sends every clientFaultCase through the real
// binary in front of three real Squids, each followed by an ordinary GET
// from another client: the broken request is answered as the client's
// fault, the next client is served, and all three members stay in service.
// Then a hundred malformed requests in a row leave all three in service.
func TestGatewayClientFaults(t *testing.T) {
	bin := testutil.BuildBinary(t)
	trio := startSquids(t, "cf", "127.0.0.141", "127.0.0.142", "127.0.0.143")
	g := startGateway(t, bin, gwConfig{upstreams: squidURLs(trio), rotation: "per-request",
		args: []string{"--request-timeout", "3s"}})
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.144"})
	other := g.client(t, "", nil)

	check := func(t *testing.T) {
		t.Helper()
		for range 3 {
			mustGetOK(t, other, tg.URL()+"/next-client", nil)
		}
		wantInService(t, g, 3)
		if n := counterSum(t, g.metricsAddr, "proxyfleet_gateway_upstream_failures_total"); n != 0 {
			t.Fatalf("%v member failures counted after a client's fault, want none", n)
		}
	}
	for _, tc := range clientFaultCases {
		t.Run(tc.name, func(t *testing.T) {
			before := tg.Total()
			raw := strings.ReplaceAll(tc.raw, "{T}", tg.Addr())
			resp, closed := sendRaw(t, g.addr, raw, tc.then)
			switch {
			case tc.status == 0 && resp != nil:
				t.Fatalf("answered %s, want no answer", resp.Status)
			case tc.status != 0 && resp == nil:
				t.Fatalf("no answer, want %d", tc.status)
			case resp != nil && (resp.StatusCode != tc.status || resp.Header.Get(hdrReason) != tc.reason):
				t.Fatalf("answered %s reason %q, want %d reason %q", resp.Status, resp.Header.Get(hdrReason), tc.status, tc.reason)
			}
			if tc.then == "" && closed != tc.closes {
				t.Fatalf("connection ended after the answer: %v, want %v", closed, tc.closes)
			}
			if reached := tg.Total() > before; reached != tc.reachesTarget {
				t.Fatalf("the request reached the target: %v, want %v", reached, tc.reachesTarget)
			}
			for _, r := range tg.Requests() {
				if strings.Contains(r.URI, "smuggled") {
					t.Fatalf("a request smuggled behind the body reached the target: %s", r.URI)
				}
				if strings.Contains(r.URI, "/fold") && r.Header.Get("X-Folded") != "a b" {
					t.Fatalf("the folded header reached the target as %q, want %q", r.Header.Get("X-Folded"), "a b")
				}
			}
			check(t)
		})
	}

	t.Run("a client that stalls mid-body gets 408 client_timeout", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", g.addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := io.WriteString(c, "POST "+tg.URL()+"/stall HTTP/1.1\r\nHost: "+tg.Addr()+"\r\nContent-Length: 100\r\n\r\nabc"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to a stalled body: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get(hdrReason) != "client_timeout" {
			t.Fatalf("answered %s reason %q, want 408 client_timeout", resp.Status, resp.Header.Get(hdrReason))
		}
		check(t)
	})

	t.Run("a hundred malformed requests in a row leave all three members in service", func(t *testing.T) {
		var bad []clientFaultCase
		for _, tc := range clientFaultCases {
			if !tc.reachesTarget {
				bad = append(bad, tc)
			}
		}
		for i := range 100 {
			tc := bad[i%len(bad)]
			sendRaw(t, g.addr, strings.ReplaceAll(tc.raw, "{T}", tg.Addr()), tc.then)
		}
		check(t)
		outcomes := scrapeCounter(t, g.metricsAddr, "proxyfleet_gateway_requests_total", "outcome", "")
		if outcomes["upstream_failed"] != 0 || outcomes["bad_request"]+outcomes["client_gone"] < 100 || outcomes["client_gone"] == 0 || outcomes["client_timeout"] != 1 {
			t.Fatalf("outcomes %v: want client faults counted as bad_request, client_gone and client_timeout, none as upstream_failed", outcomes)
		}
	})
}

// sendRaw writes raw on a new connection to addr, then does what then says
// (see clientFaultCase) and reads the first answer: nil when none came.
// closed reports whether the connection ended after that answer (and after
// the gateway's answer to bytes sent behind the request, if any).
func sendRaw(t *testing.T, addr, raw, then string) (resp *http.Response, closed bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	switch then {
	case "hang-up":
		return nil, true
	case "half-close":
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, true
		}
		t.Fatalf("reading the answer: %v", err)
	}
	// The gateway may close with unread bytes of the request behind the
	// answer (a 431 head), which resets the connection: the answer's head
	// is what counts.
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if then != "" {
		return resp, true
	}
	return resp, endsAfter(t, c, br)
}

// probeRequest is a harmless next request: the gateway answers it 400
// ("this is a forward proxy") and keeps the connection.
const probeRequest = "GET /probe HTTP/1.1\r\nHost: x\r\n\r\n"

// endsAfter tells an ended connection from one kept for a next request by
// sending probeRequest on it. An answer to bytes that were sent behind the
// first request (a malformed next request) comes first and must end it.
func endsAfter(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	if _, err := io.WriteString(c, probeRequest); err != nil {
		return true
	}
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return true
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "forward proxy") {
			return false // the probe was answered: the connection goes on
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("the bytes behind the request were answered %s, want 400", resp.Status)
		}
	}
}

// counterSum is the sum of every series of a metric, 0 when it has none.
func counterSum(t *testing.T, metricsAddr, name string) float64 {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			var v float64
			if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}
