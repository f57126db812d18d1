package health

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestProbeThroughRealSquid probes in-test targets through a real Squid:
// plain HTTP as a proxied request, HTTPS through CONNECT with TLS inside,
// and every way a probe fails.
func TestProbeThroughRealSquid(t *testing.T) {
	sq := squid.Start(t, squid.Options{Name: "probe", OutgoingAddr: "127.0.0.5"})
	// An authenticating Squid, as a VM's bootstrap runs: probes must log in.
	const pw = "pr0be-pa55word"
	authSquid := squid.Start(t, squid.Options{Name: "probe-auth", OutgoingAddr: "127.0.0.5",
		BasicAuth: &squid.Login{Username: "proxyfleet", Password: pw}})
	wrongLogin := "http://proxyfleet:not-" + pw + "@" + authSquid.Addr()
	plain := testutil.StartTarget(t, testutil.TargetOptions{})
	secure := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	refused := closedAddr(t)
	silent := silentListener(t)
	sec := time.Second

	tests := []struct {
		name    string
		proxy   string
		target  string
		expect  int
		timeout time.Duration
		tls     bool // trust the TLS target's certificate
		setup   func(t *testing.T)
		wantErr string // "" = success
		seenBy  *testutil.Target
	}{
		{name: "a login in the proxy URL gets through an authenticating proxy", proxy: authSquid.LoginURL(), target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, seenBy: plain},
		{name: "the login also reaches the proxy for CONNECT", proxy: authSquid.LoginURL(), target: secure.URL() + "/probe", expect: 200, timeout: 5 * sec, tls: true, seenBy: secure},
		{name: "an authenticating proxy without a login fails with 407 said plainly", proxy: authSquid.Addr(), target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, wantErr: "answered 407: the proxy demands a login and the Proxy has none"},
		{name: "a wrong login fails without leaking it", proxy: wrongLogin, target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, wantErr: `answered 407: the proxy refused the Proxy's login (user "proxyfleet")`},
		{name: "an http URL is fetched through the proxy", proxy: sq.Addr(), target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, seenBy: plain},
		{name: "an https URL goes through CONNECT with TLS inside", proxy: sq.Addr(), target: secure.URL() + "/probe", expect: 200, timeout: 5 * sec, tls: true, seenBy: secure},
		{name: "TLS inside the tunnel is verified", proxy: sq.Addr(), target: secure.URL() + "/probe", expect: 200, timeout: 5 * sec, wantErr: "certificate"},
		{
			name: "an unexpected status fails", proxy: sq.Addr(), target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec,
			setup: func(t *testing.T) {
				plain.SetRule("127.0.0.5", 503, nil)
				t.Cleanup(func() { plain.ClearRule("127.0.0.5") })
			},
			wantErr: "answered 503, want 200",
		},
		{
			name: "the expected status may be any code", proxy: sq.Addr(), target: plain.URL() + "/probe", expect: 503, timeout: 5 * sec,
			setup: func(t *testing.T) {
				plain.SetRule("127.0.0.5", 503, nil)
				t.Cleanup(func() { plain.ClearRule("127.0.0.5") })
			},
		},
		{name: "a proxy that refuses connections fails", proxy: refused, target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, wantErr: "connection refused"},
		{name: "a target that never answers times out", proxy: sq.Addr(), target: "http://" + silent + "/probe", expect: 200, timeout: sec, wantErr: "no answer within 1s"},
		{
			name: "credentials in the probe URL never appear in the message", proxy: sq.Addr(), expect: 204, timeout: 5 * sec,
			target: "http://probe:s3cret@" + plain.Addr() + "/probe", wantErr: "answered 200, want 204",
		},
		{
			name: "the environment's proxy settings are ignored", proxy: sq.Addr(), target: plain.URL() + "/probe", expect: 200, timeout: 5 * sec, seenBy: plain,
			setup: func(t *testing.T) {
				t.Setenv("HTTP_PROXY", "http://"+refused)
				t.Setenv("HTTPS_PROXY", "http://"+refused)
				t.Setenv("NO_PROXY", "")
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(t)
			}
			var before int
			if tc.seenBy != nil {
				before = tc.seenBy.Count("127.0.0.5")
			}
			tlsConf := secure.ClientTLSConfig()
			if !tc.tls {
				tlsConf = nil
			}
			start := time.Now()
			proxy := tc.proxy
			if !strings.Contains(proxy, "://") {
				proxy = "http://" + proxy
			}
			err := probeThrough(context.Background(), mustURL(t, proxy), mustURL(t, tc.target), tc.expect, tc.timeout, tlsConf)
			took := time.Since(start)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("probe: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("probe error %v, want one containing %q", err, tc.wantErr)
			}
			if err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), pw)) {
				t.Errorf("the probe error leaks the URL's password: %v", err)
			}
			if tc.seenBy != nil && tc.seenBy.Count("127.0.0.5") != before+1 {
				t.Errorf("the target saw %d requests from Squid's outgoing address, want %d: the probe did not go through Squid",
					tc.seenBy.Count("127.0.0.5"), before+1)
			}
			if took > tc.timeout+2*time.Second {
				t.Errorf("probe took %s with a %s timeout", took, tc.timeout)
			}
		})
	}
}

// TestProbeOpensAFreshConnectionEachTime puts a connection-counting relay in
// front of a real Squid: every probe must open (and close) its own
// connection, so a CONNECT tunnel is never reused across probes.
func TestProbeOpensAFreshConnectionEachTime(t *testing.T) {
	sq := squid.Start(t, squid.Options{Name: "keepalive"})
	relay := startCountingRelay(t, sq.Addr())
	plain := testutil.StartTarget(t, testutil.TargetOptions{})
	secure := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	for _, tc := range []struct {
		name   string
		target string
	}{
		{"plain http", plain.URL() + "/"},
		{"https through CONNECT", secure.URL() + "/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := relay.accepted.Load()
			const probes = 3
			for range probes {
				if err := probeThrough(context.Background(), mustURL(t, "http://"+relay.addr), mustURL(t, tc.target), 200, 5*time.Second, secure.ClientTLSConfig()); err != nil {
					t.Fatalf("probe: %v", err)
				}
			}
			if got := relay.accepted.Load() - before; got != probes {
				t.Fatalf("%d probes opened %d connections to the proxy, want one each", probes, got)
			}
			poll.Until(t, 10*time.Second, "the probes' connections to the proxy closed", func() error {
				if n := relay.open.Load(); n != 0 {
					return fmt.Errorf("%d connections to the proxy still open after the probes", n)
				}
				return nil
			})
		})
	}
}

// countingRelay forwards TCP connections to a backend and counts them.
type countingRelay struct {
	addr     string
	accepted atomic.Int64
	open     atomic.Int64
}

func startCountingRelay(t *testing.T, backend string) *countingRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &countingRelay{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			r.open.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer r.open.Add(-1)
				defer c.Close()
				b, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				defer b.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
				<-done // either side closing ends the relayed connection
			}()
		}
	}()
	return r
}

// closedAddr is a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// silentListener accepts connections and never answers.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}
