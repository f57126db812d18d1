package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// squidMembers starts real Squids and returns them with their pool members.
func squidMembers(t *testing.T, opts ...squid.Options) ([]*squid.Squid, []pool.Member) {
	t.Helper()
	squids := squid.StartAll(t, opts...)
	members := make([]pool.Member, len(squids))
	for i, s := range squids {
		u, err := url.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		members[i] = pool.Member{Name: s.Name(), URL: u}
	}
	return squids, members
}

// closedAddr is host:port on ip where nothing listens (connections are refused).
func closedAddr(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// memberWide lists the members resting for every target.
func memberWide(store *pool.Store) []string {
	var out []string
	for _, m := range store.Members() {
		if _, ok := m.Cooldowns[""]; ok {
			out = append(out, m.Name)
		}
	}
	return out
}

// restingFor counts the members resting for target.
func restingFor(store *pool.Store, target string) int {
	n := 0
	for _, m := range store.Members() {
		if _, ok := m.Cooldowns[target]; ok {
			n++
		}
	}
	return n
}

// TestDeadSitesTakeNoSquidOutOfService is the crawler following dead links:
// through three real Squids, names that do not resolve and a port that
// refuses connections get 502 target_unreachable with Squid's reason, each
// dead site is tried on two members at most, and right after, per-request
// rotation still reaches all three Squids.
func TestDeadSitesTakeNoSquidOutOfService(t *testing.T) {
	_, members := squidMembers(t,
		squid.Options{Name: "dead-a", OutgoingAddr: "127.0.0.51"},
		squid.Options{Name: "dead-b", OutgoingAddr: "127.0.0.52"},
		squid.Options{Name: "dead-c", OutgoingAddr: "127.0.0.53"},
	)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	live := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	refused := closedAddr(t, "127.0.0.9")

	dead := []string{refused}
	for _, l := range "abcdef" {
		dead = append(dead, "nx-"+string(l)+".invalid:443")
	}
	for _, target := range dead {
		_, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 60*time.Second)
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		b := body(t, resp)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != "target_unreachable" || !strings.Contains(b, "X-Squid-Error ERR_") {
			t.Fatalf("CONNECT %s: %d %s %q, want 502 target_unreachable with Squid's reason", target, resp.StatusCode, resp.Header.Get(HeaderReason), b)
		}
		host, _, _ := net.SplitHostPort(target)
		if n := restingFor(e.store, host); n != 2 {
			t.Fatalf("after CONNECT %s, %d members rest for it; want 2 (the same failure on two members is the site's)", target, n)
		}
	}
	t.Run("an https:// absolute URI to a dead name", func(t *testing.T) {
		// The transport CONNECTs through the member itself here.
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET https://nx-abs.invalid/ HTTP/1.1\r\nHost: nx-abs.invalid\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b := body(t, resp)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != "target_unreachable" || !strings.Contains(b, "X-Squid-Error") {
			t.Fatalf("GET https://: %d %s %q, want 502 target_unreachable", resp.StatusCode, resp.Header.Get(HeaderReason), b)
		}
	})
	t.Run("plain HTTP to a dead name", func(t *testing.T) {
		resp, err := e.client("", "").Get("http://nx-plain.invalid/")
		if err != nil {
			t.Fatal(err)
		}
		b := body(t, resp)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != "target_unreachable" || !strings.Contains(b, "X-Squid-Error") {
			t.Fatalf("GET: %d %s %q, want 502 target_unreachable", resp.StatusCode, resp.Header.Get(HeaderReason), b)
		}
	})
	if mw := memberWide(e.store); len(mw) != 0 {
		t.Fatalf("members out for every site after dead sites only: %v", mw)
	}
	c := testutil.MustProxyClient(t, "http://"+e.addr, live.ClientTLSConfig())
	c.Transport.(*http.Transport).DisableKeepAlives = true
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		resp, a := get(t, c, live.URL()+"/after", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("live site after dead ones: %d %s", resp.StatusCode, body(t, resp))
		}
		seen[a.Source] = true
	}
	if len(seen) != 3 {
		t.Fatalf("per-request rotation reached %v after the dead sites; want all three Squids", seen)
	}
}

// TestASquidRefusingEveryConnectGoesOut: a Squid whose policy refuses every
// CONNECT answers 403 ERR_ACCESS_DENIED — an answer about the site, taken
// alone — while the other two reach the same sites. Once it has failed
// enough distinct sites that others reached, it is out for every site; the
// client never sees its refusals, because each was retried elsewhere.
func TestASquidRefusingEveryConnectGoesOut(t *testing.T) {
	_, members := squidMembers(t,
		squid.Options{Name: "ev-a", OutgoingAddr: "127.0.0.54"},
		squid.Options{Name: "ev-b", OutgoingAddr: "127.0.0.55"},
		squid.Options{Name: "ev-broken", OutgoingAddr: "127.0.0.56", AccessFirst: []string{"http_access deny CONNECT"}},
	)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	var sites []*testutil.Target
	for i := 0; i < 4; i++ {
		sites = append(sites, testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0." + strconv.Itoa(61+i)}))
	}
	for i := 0; i < 40 && len(memberWide(e.store)) == 0; i++ {
		site := sites[i%len(sites)]
		c := testutil.MustProxyClient(t, "http://"+e.addr, site.ClientTLSConfig())
		c.Transport.(*http.Transport).DisableKeepAlives = true
		resp, a := get(t, c, site.URL()+"/ev", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s; the refusing Squid's answer should have been retried elsewhere", i, resp.StatusCode, body(t, resp))
		}
		if a.Source == "127.0.0.56" {
			t.Fatalf("request %d went out through the refusing Squid", i)
		}
	}
	if mw := memberWide(e.store); fmt.Sprint(mw) != "[ev-broken]" {
		t.Fatalf("members out for every site: %v, want [ev-broken]", mw)
	}
}

// TestAKilledSquidGoesOutAndComesBack: refused connections are evidence
// about the member itself, so a killed Squid is out for every site at once,
// and back once it returns and its failure window has passed.
func TestAKilledSquidGoesOutAndComesBack(t *testing.T) {
	squids, members := squidMembers(t,
		squid.Options{Name: "kill-a", OutgoingAddr: "127.0.0.57"},
		squid.Options{Name: "kill-b", OutgoingAddr: "127.0.0.58"},
	)
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 2, AllowPrivateTargets: true},
		pool.StoreOptions{FailureWindow: 2 * time.Second}, members...)
	live := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	c := testutil.MustProxyClient(t, "http://"+e.addr, live.ClientTLSConfig())
	c.Transport.(*http.Transport).DisableKeepAlives = true

	squids[0].Kill()
	for i := 0; i < 4; i++ {
		if resp, a := get(t, c, live.URL()+"/k", nil); resp.StatusCode != http.StatusOK || a.Source != "127.0.0.58" {
			t.Fatalf("with kill-a dead: %d via %q", resp.StatusCode, a.Source)
		}
	}
	if mw := memberWide(e.store); fmt.Sprint(mw) != "[kill-a]" {
		t.Fatalf("members out for every site: %v, want [kill-a]", mw)
	}
	squids[0].Start()
	poll.Until(t, 60*time.Second, "the restarted member to serve the live site again", func() error {
		resp, a := get(t, c, live.URL()+"/back", nil)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		if a.Source != "127.0.0.57" {
			return fmt.Errorf("served via %s, not yet the returned Squid", a.Source)
		}
		return nil
	})
}
