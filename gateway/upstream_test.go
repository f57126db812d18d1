package gateway

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// seenRequest is what a scripted upstream received.
type seenRequest struct {
	conn      int // which connection (1-based) carried it
	method    string
	uri       string
	proxyAuth string
	body      string
}

// scriptedUpstream is an HTTP proxy on 127.0.0.1 that answers each request
// with the raw bytes answer returns; closeAfter closes the connection
// after that answer. It records every request and counts connections.
type scriptedUpstream struct {
	member pool.Member
	conns  atomic.Int32
	closed atomic.Int32 // connections the upstream has closed
	// afterAnswer, when set before the first request, runs after each answer.
	afterAnswer func(w io.Writer)
	mu          sync.Mutex
	seen        []seenRequest
}

func startScriptedUpstream(t *testing.T, name string, answer func(r *http.Request) (raw string, closeAfter bool)) *scriptedUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &scriptedUpstream{member: pool.Member{Name: name, URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.conns.Add(1))
			go func() {
				defer func() { c.Close(); s.closed.Add(1) }()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(req.Body)
					s.mu.Lock()
					s.seen = append(s.seen, seenRequest{conn: n, method: req.Method, uri: req.RequestURI,
						proxyAuth: req.Header.Get("Proxy-Authorization"), body: string(b)})
					s.mu.Unlock()
					raw, closeAfter := answer(req)
					if _, err := io.WriteString(c, raw); err != nil || closeAfter {
						return
					}
					if s.afterAnswer != nil {
						s.afterAnswer(c)
					}
				}
			}()
		}
	}()
	return s
}

func (s *scriptedUpstream) requests() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.seen...)
}

// rawProxyGet sends one request through the gateway on conn and reads the answer.
func rawProxyGet(t *testing.T, c net.Conn, br *bufio.Reader, method, u string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.WriteProxy(c); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s body: %v", method, u, err)
	}
	resp.Body.Close()
	return resp, string(b)
}

func TestLeanPathFraming(t *testing.T) {
	const target = "http://127.0.0.1:9/"
	tests := []struct {
		name       string
		method     string
		raw        string
		closeAfter bool
		wantStatus int
		wantBody   string
		wantHeader [2]string // a header the client must see
		wantConns  int32     // upstream connections after two requests
	}{
		{name: "content-length body, connection reused", method: "GET",
			raw:        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Site: a\r\n\r\nhello",
			wantStatus: 200, wantBody: "hello", wantHeader: [2]string{"X-Site", "a"}, wantConns: 1},
		{name: "chunked body, connection reused", method: "GET",
			raw:        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
			wantStatus: 200, wantBody: "abcde", wantConns: 1},
		{name: "HEAD answer with a length but no body, connection reused", method: "HEAD",
			raw:        "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
			wantStatus: 200, wantBody: "", wantHeader: [2]string{"Content-Length", "1234"}, wantConns: 1},
		{name: "204 has no body, connection reused", method: "GET",
			raw:        "HTTP/1.1 204 No Content\r\n\r\n",
			wantStatus: 204, wantBody: "", wantConns: 1},
		{name: "304 has no body, connection reused", method: "GET",
			raw:        "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n",
			wantStatus: 304, wantBody: "", wantHeader: [2]string{"Etag", "\"x\""}, wantConns: 1},
		{name: "1xx interim answers are skipped", method: "GET",
			raw:        "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			wantStatus: 200, wantBody: "ok", wantConns: 1},
		{name: "Connection: close is honoured with a new connection next", method: "GET",
			raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye", closeAfter: true,
			wantStatus: 200, wantBody: "bye", wantConns: 2},
		{name: "body delimited by close is read to the end", method: "GET",
			raw: "HTTP/1.1 200 OK\r\n\r\nuntil the end", closeAfter: true,
			wantStatus: 200, wantBody: "until the end", wantConns: 2},
		{name: "HTTP/1.0 answer without keep-alive closes", method: "GET",
			raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", closeAfter: true,
			wantStatus: 200, wantBody: "hi", wantConns: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) { return tc.raw, tc.closeAfter })
			e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for i := 0; i < 2; i++ {
				resp, b := rawProxyGet(t, c, br, tc.method, target)
				if resp.StatusCode != tc.wantStatus || b != tc.wantBody {
					t.Fatalf("request %d: got %d %q, want %d %q", i, resp.StatusCode, b, tc.wantStatus, tc.wantBody)
				}
				if k := tc.wantHeader[0]; k != "" && resp.Header.Get(k) != tc.wantHeader[1] {
					t.Fatalf("request %d: header %s = %q, want %q", i, k, resp.Header.Get(k), tc.wantHeader[1])
				}
				if resp.Header.Get(HeaderProxy) != "u" || resp.Header.Get(HeaderLease) == "" {
					t.Fatalf("request %d: gateway headers missing: %v", i, resp.Header)
				}
			}
			if got := up.conns.Load(); got != tc.wantConns {
				t.Fatalf("upstream saw %d connections, want %d", got, tc.wantConns)
			}
			if tc.wantConns == 1 {
				// The lean path (not the Transport) holds the kept-alive connection.
				if n := len(e.gw.links.memberByName("u").Lean.Idle()); n != 1 {
					t.Fatalf("lean pool holds %d idle connections, want 1", n)
				}
			}
			for _, r := range up.requests() {
				if r.uri != target || r.method != tc.method {
					t.Fatalf("upstream got %s %s, want %s %s (absolute URI)", r.method, r.uri, tc.method, target)
				}
			}
			if n := e.rec.failuresOf("u"); n != 0 {
				t.Fatalf("%d upstream failures recorded, want 0", n)
			}
		})
	}
}

func TestLeanPathPassesTrailers(t *testing.T) {
	up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 42\r\n\r\n", false
	})
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
	resp, err := e.client("", "").Get("http://127.0.0.1:9/t")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); b != "ok" {
		t.Fatalf("body %q, want ok", b)
	}
	if got := resp.Trailer.Get("X-Sum"); got != "42" {
		t.Fatalf("trailer X-Sum = %q, want 42 (trailers %v)", got, resp.Trailer)
	}
}

func TestLeanPathReplacesAConnectionTheUpstreamDropped(t *testing.T) {
	for _, method := range []string{"GET", "DELETE"} {
		t.Run(method+" succeeds on a fresh connection", func(t *testing.T) {
			// The upstream answers with keep-alive, then drops the idle
			// connection without saying so.
			up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
				return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true
			})
			e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
			c := e.client("", "")
			for i := 0; i < 3; i++ {
				req, _ := http.NewRequest(method, "http://127.0.0.1:9/", nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if b := body(t, resp); resp.StatusCode != 200 || b != "ok" {
					t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
				}
				poll.Until(t, 20*time.Second, "the upstream closing its connection", func() error {
					return poll.Check(up.closed.Load() == int32(i+1), "%d connections closed", up.closed.Load())
				}, poll.Every(time.Millisecond))
			}
			if n := e.rec.failuresOf("u"); n != 0 {
				t.Fatalf("%d upstream failures recorded, want 0", n)
			}
			if got := up.conns.Load(); got != 3 {
				t.Fatalf("upstream saw %d connections, want 3", got)
			}
		})
	}
}

func TestLeanPathIgnoresBytesSentOnAnIdleConnection(t *testing.T) {
	// After its first answer the upstream sends an unsolicited 408, either
	// right behind the answer or later on the idle connection; the next
	// request must not take it for its own answer.
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	const unasked = "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"
	for _, later := range []bool{false, true} {
		name := "right behind the answer"
		if later {
			name = "on the idle connection"
		}
		t.Run(name, func(t *testing.T) {
			var first atomic.Bool
			first.Store(true)
			send := make(chan struct{})
			up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
				if first.Swap(false) {
					if later {
						return ok, false
					}
					return ok + unasked, false
				}
				return ok, false
			})
			up.afterAnswer = func(w io.Writer) {
				if later {
					<-send
					_, _ = io.WriteString(w, unasked)
				}
			}
			e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
			c := e.client("", "")
			for i := 0; i < 2; i++ {
				resp, err := c.Get("http://127.0.0.1:9/")
				if err != nil {
					t.Fatal(err)
				}
				if b := body(t, resp); resp.StatusCode != 200 || b != "ok" {
					t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
				}
				if i == 0 && later {
					idle := e.gw.links.memberByName("u").Lean.Idle
					poll.Until(t, 20*time.Second, "the connection to go idle", func() error {
						return poll.Check(len(idle()) == 1, "%d idle connections", len(idle()))
					}, poll.Every(time.Millisecond))
					close(send)
					poll.Until(t, 20*time.Second, "the unsolicited answer to arrive", func() error {
						return poll.Check(idle()[0].Unusable(), "the idle connection still looks usable")
					}, poll.Every(time.Millisecond))
				}
			}
		})
	}
}

func TestLeanPathRefusesAnOversizedAnswerHead(t *testing.T) {
	up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", link.MaxResponseHead+10) + "\r\nContent-Length: 0\r\n\r\n", true
	})
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
	resp, err := e.client("", "").Get("http://127.0.0.1:9/")
	if err != nil {
		t.Fatal(err)
	}
	b := body(t, resp)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(b, "larger than 1 MiB") {
		t.Fatalf("got %d %q, want 502 naming the size limit", resp.StatusCode, b)
	}
}

func TestLeanPathSendsEachMembersOwnCredentials(t *testing.T) {
	// The member with credentials bans the target, so the GET is retried
	// on the member without: it must not see the first member's credentials.
	banning := startScriptedUpstream(t, "a-creds", func(*http.Request) (string, bool) {
		return "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", false
	})
	banning.member.URL.User = url.UserPassword("alice", "s3cret")
	plain := startScriptedUpstream(t, "b-plain", func(*http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	e := newEnv(t, Options{AllowPrivateTargets: true, Retries: 1, Mode: rotation.ModeRequest},
		pool.StoreOptions{}, banning.member, plain.member)
	resp, err := e.client("client", "").Get("http://127.0.0.1:9/")
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp)
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	if got := banning.requests(); len(got) != 1 || got[0].proxyAuth != want {
		t.Fatalf("member with credentials saw %+v, want one request with %q", got, want)
	}
	if got := plain.requests(); len(got) != 1 || got[0].proxyAuth != "" {
		t.Fatalf("member without credentials saw %+v, want one request without Proxy-Authorization", got)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want the retried 200", resp.StatusCode)
	}
}

func TestRequestBodiesStillTravel(t *testing.T) {
	up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
		return "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", false
	})
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, up.member)
	resp, err := e.client("", "").Post("http://127.0.0.1:9/p", "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp)
	if got := up.requests(); resp.StatusCode != 201 || len(got) != 1 || got[0].body != "payload" || got[0].method != "POST" {
		t.Fatalf("got %d, upstream saw %+v", resp.StatusCode, got)
	}
}

func TestLeanPathRequestTimeoutIsNotTheMembersFault(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := startScriptedUpstream(t, "u", func(*http.Request) (string, bool) {
		<-release
		return "", true
	})
	e := newEnv(t, Options{AllowPrivateTargets: true, RequestTimeout: 200 * time.Millisecond}, pool.StoreOptions{}, up.member)
	resp, err := e.client("", "").Get("http://127.0.0.1:9/")
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
	if n := e.rec.failuresOf("u"); n != 0 {
		t.Fatalf("%d upstream failures recorded for a slow site, want 0", n)
	}
}
