package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// silentMember is what a hung Squid, a frozen VM or a half-dead NAT looks
// like from the gateway: a listener of the test's own that accepts
// connections and never sends a byte, until relayTo makes it pass them to
// a real Squid (it "answers again").
type silentMember struct {
	ln    net.Listener
	relay atomic.Pointer[string]
	mu    sync.Mutex
	conns []net.Conn
}

func startSilentMember(t *testing.T, host string) *silentMember {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentMember{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			if to := s.relay.Load(); to != nil {
				go relayConn(c, *to)
				continue
			}
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads, never answers
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

func (s *silentMember) addr() string { return s.ln.Addr().String() }
func (s *silentMember) url() string  { return "http://" + s.addr() }

// relayTo makes connections accepted from now on pass to addr.
func (s *silentMember) relayTo(addr string) { s.relay.Store(&addr) }

func relayConn(c net.Conn, to string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", to, 10*time.Second)
	if err != nil {
		return
	}
	defer u.Close()
	go func() { _, _ = io.Copy(u, c); _ = u.(*net.TCPConn).CloseWrite() }()
	_, _ = io.Copy(c, u)
}

// startSlowSite answers every request after delay.
func startSlowSite(t *testing.T, host string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		_, _ = io.WriteString(w, "slow but here")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestGatewaySilentMembers is a member that accepts connections and never
// answers, beside real Squids, with no health probes: a request that meets
// it costs the answer timeout and one more round trip, never the request
// deadline; the member is out for every site after the first silence, and
// back once it answers again. A slow site that does answer is still served
// when its answer timeout is raised.
func TestGatewaySilentMembers(t *testing.T) {
	bin := testutil.BuildBinary(t)
	const answer = 2 * time.Second
	// A request that meets the silent member may take the answer timeout and
	// a normal round trip; the bound below leaves that round trip a lot of
	// room on a busy machine and stays far under the request deadline.
	bound := answer + 8*time.Second
	args := func(extra ...string) []string {
		return append([]string{"--member-answer-timeout", answer.String(), "--dial-timeout", "2s",
			"--failure-cooldown", "4s", "--request-timeout", "60s"}, extra...)
	}

	t.Run("idempotent GETs are served past a silent member, which goes out and comes back", func(t *testing.T) {
		t.Parallel()
		pair := startSquids(t, "silentget", "127.0.0.151", "127.0.0.152")
		silent := startSilentMember(t, "127.0.0.1")
		g := startGateway(t, bin, gwConfig{upstreams: append(squidURLs(pair), silent.url()), rotation: "per-request", args: args()})
		tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.153"})
		c := g.client(t, "", nil)
		for i := range 30 {
			start := time.Now()
			r := mustGetOK(t, c, fmt.Sprintf("%s/get-%d", tg.URL(), i), nil)
			if d := time.Since(start); d > bound {
				t.Fatalf("GET %d took %v through %s, want at most the answer timeout and a round trip (%v)", i, d, r.proxy, bound)
			}
			if r.proxy == silent.addr() {
				t.Fatalf("GET %d was answered through the silent member", i)
			}
		}
		poll.Until(t, 30*time.Second, "the silent member out of service", func() error {
			if got := scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", "")["true"]; got != 2 {
				return fmt.Errorf("%v members in service, want 2: the silent one out", got)
			}
			return nil
		})
		silent.relayTo(pair[0].Addr())
		poll.Until(t, 60*time.Second, "the relaying member back in service", func() error {
			r, err := doGet(c, tg.URL()+"/back", http.Header{"X-Proxyfleet-Proxy": {silent.addr()}})
			if err != nil {
				return err
			}
			if r.status != http.StatusOK {
				return fmt.Errorf("pinned to the member that answers again: %d %s", r.status, r.reason)
			}
			return nil
		})
	})

	t.Run("a POST to the silent member is 504 member_timeout within the answer timeout", func(t *testing.T) {
		t.Parallel()
		one := startSquids(t, "silentpost", "127.0.0.154")
		silent := startSilentMember(t, "127.0.0.1")
		g := startGateway(t, bin, gwConfig{upstreams: append(squidURLs(one), silent.url()), rotation: "per-request", args: args()})
		tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.155"})
		req, err := http.NewRequest(http.MethodPost, tg.URL()+"/post", strings.NewReader("order=1"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Proxyfleet-Proxy", silent.addr())
		start := time.Now()
		resp, err := g.client(t, "", nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if d := time.Since(start); d > bound {
			t.Fatalf("the POST took %v, want at most %v", d, bound)
		}
		if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(hdrReason) != "member_timeout" || !strings.Contains(body, "not tried on another member") {
			t.Fatalf("POST through the silent member: %s %q %q, want 504 member_timeout saying it was not retried", resp.Status, resp.Header.Get(hdrReason), body)
		}
		if tg.Total() != 0 {
			t.Fatalf("the target saw %d requests, want none", tg.Total())
		}
		poll.Until(t, 30*time.Second, "the silent member out for every site", func() error {
			if got := scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", "")["true"]; got != 1 {
				return fmt.Errorf("%v members in service, want 1: the silent one out for every site", got)
			}
			return nil
		})
	})

	t.Run("CONNECT past a member that never answers the CONNECT", func(t *testing.T) {
		t.Parallel()
		pair := startSquids(t, "silentconn", "127.0.0.156", "127.0.0.157")
		silent := startSilentMember(t, "127.0.0.1")
		g := startGateway(t, bin, gwConfig{upstreams: append(squidURLs(pair), silent.url()), rotation: "per-request", args: args()})
		site := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.158"})
		tc := g.tunnelClient(t, "", site.ClientTLSConfig())
		for i := range 12 {
			start := time.Now()
			mustGetOK(t, tc, fmt.Sprintf("%s/tunnel-%d", site.URL(), i), nil)
			if d := time.Since(start); d > bound {
				t.Fatalf("tunnel %d took %v, want at most %v", i, d, bound)
			}
		}
		poll.Until(t, 30*time.Second, "the silent member out of service", func() error {
			if got := scrapeCounter(t, g.metricsAddr, "proxyfleet_members", "healthy", "")["true"]; got != 2 {
				return fmt.Errorf("%v members in service, want 2: the silent one out", got)
			}
			return nil
		})
	})

	t.Run("a slow site that answers is served when its answer timeout is raised, and costs no member", func(t *testing.T) {
		t.Parallel()
		pair := startSquids(t, "slowsite", "127.0.0.159", "127.0.0.160")
		slowRaised := startSlowSite(t, "127.0.0.161", 2*answer)
		slowDefault := startSlowSite(t, "127.0.0.162", 2*answer)
		g := startGateway(t, bin, gwConfig{upstreams: squidURLs(pair), rotation: "per-request",
			args: args("--site-answer-timeout", "127.0.0.161=30s")})
		c := g.client(t, "", nil)
		r := mustGet(t, c, slowRaised+"/raised", nil)
		if r.status != http.StatusOK || r.body != "slow but here" {
			t.Fatalf("the slow site with a raised answer timeout: %d %s %q, want its answer", r.status, r.reason, r.body)
		}
		r = mustGet(t, c, slowDefault+"/default", nil)
		if r.status != http.StatusGatewayTimeout || r.reason != "member_timeout" {
			t.Fatalf("the slow site with the default answer timeout: %d %s, want 504 member_timeout", r.status, r.reason)
		}
		// Both members answered the aliveness question: a slow site takes
		// neither out.
		time.Sleep(3 * time.Second) // the aliveness checks run in the background, for at most --dial-timeout
		wantInService(t, g, 2)
	})
}
