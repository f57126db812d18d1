package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/headsite"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// httpTunnel opens a CONNECT tunnel the gateway reads as plain HTTP (the
// target's port is one of ConnectHTTPPorts), through one direct member.
func httpTunnel(t *testing.T, target string, port int) net.Conn {
	t.Helper()
	e := newEnv(t, Options{AllowPrivateTargets: true, ConnectHTTPPorts: []uint16{uint16(port)}}, pool.StoreOptions{}, directMembers(1)...)
	c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 10*time.Second)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// TestAnHTTPTunnelKeepsTheClientsHeaderOrder: a request inside a tunnel
// the gateway reads as plain HTTP (a browser's ws:// or http:// through
// CONNECT host:80) reaches the site with its fields in the order and case
// the client wrote them, less the hop-by-hop ones.
func TestAnHTTPTunnelKeepsTheClientsHeaderOrder(t *testing.T) {
	site := headsite.Start(t, "127.0.0.1", false)
	addr := site.URL()[len("http://"):]
	_, port, _ := net.SplitHostPort(addr)
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	c := httpTunnel(t, addr, n)
	head := "GET /order HTTP/1.1\r\nhost: " + addr + "\r\nConnection: keep-alive, X-Hop\r\nzed: 1\r\nX-Hop: 1\r\nUser-Agent: ua\r\nAccept: */*\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("answer %v, %v", resp, err)
	}
	want := "GET /order HTTP/1.1\r\nhost: " + addr + "\r\nConnection: keep-alive\r\nzed: 1\r\nUser-Agent: ua\r\nAccept: */*\r\n\r\n"
	heads := site.Heads()
	if len(heads) != 1 || heads[0].Raw != want {
		t.Fatalf("the site received %q, want %q", heads, want)
	}
}

// TestAnHTTPTunnelServesHTTP2WithPriorKnowledge: a client that starts a
// tunnel the gateway reads as plain HTTP with HTTP/2's preface (h2c with
// prior knowledge) is served over HTTP/2 (the gateway's HTTP/1.1 server
// hands such a connection to its HTTP/2 one).
func TestAnHTTPTunnelServesHTTP2WithPriorKnowledge(t *testing.T) {
	tg := testutil.StartTarget(t, testutil.TargetOptions{})
	c := httpTunnel(t, tg.Addr(), tg.Port())
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: protos, DialContext: func(context.Context, string, string) (net.Conn, error) { return c, nil }}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "http://"+tg.Addr()+"/h2c", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("got %s over %s, want 200 over HTTP/2", resp.Status, resp.Proto)
	}
	if n := tg.Total(); n != 1 {
		t.Fatalf("the site saw %d requests, want 1", n)
	}
}
