package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// deadPort stands in for a Squid that never returns, on its port: it
// takes connections and closes them at once (a member that answers
// nothing), and counts the ones that carried a client's request for
// site (host:port): a CONNECT to it or an absolute URI naming it, not the
// gateway's liveness question (an origin-form GET, which a forward proxy
// would refuse) and not a probe, which asks a site of its own: the prober
// goes on asking a dead member whether it is back, as it should.
func deadPort(t *testing.T, addr, site string) *atomic.Int64 {
	t.Helper()
	var ln net.Listener
	poll.Until(t, 30*time.Second, "the killed Squid's port to be free", func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	t.Cleanup(func() { ln.Close() })
	var carried atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				if f := strings.Fields(line); len(f) > 1 && !strings.HasPrefix(f[1], "/") && strings.Contains(f[1], site) {
					carried.Add(1)
				}
			}()
		}
	}()
	return &carried
}

// TestFourSquidsKilledTogetherServeAgainAtOnce is a blip of the whole
// fleet: four real Squids killed at once and restarted 1.5s later. With a
// 60s --failure-cooldown, every member resting for its failures would
// answer 503 no_member for most of a minute; instead at most half of them
// rest, the rest are asked every second whether they answer, and so the
// requests right after the Squids are back are all served, and every
// Squid serves again long before its window ends. A fourth Squid that
// never returns carries no request once the others serve. With probes
// (every 2s, the default thresholds) the same holds.
func TestFourSquidsKilledTogetherServeAgainAtOnce(t *testing.T) {
	for _, probes := range []bool{false, true} {
		t.Run(map[bool]string{false: "without probes", true: "with probes"}[probes], func(t *testing.T) {
			fleetBlip(t, probes)
		})
	}
}

func fleetBlip(t *testing.T, probes bool) {
	base := 61
	if probes {
		base = 65
	}
	var opts []squid.Options
	for i := range 4 {
		opts = append(opts, squid.Options{Name: fmt.Sprintf("blip-%d", i), OutgoingAddr: fmt.Sprintf("127.0.0.%d", base+i)})
	}
	squids, members := squidMembers(t, opts...)
	const window = 60 * time.Second
	e := newEnv(t, Options{Mode: rotation.ModeRequest, Retries: 3, AllowPrivateTargets: true, FailureWindow: window},
		pool.StoreOptions{FailureWindow: window}, members...)
	live := testutil.StartTLSTarget(t, testutil.TargetOptions{})
	if probes {
		// The probes ask a site of their own, so the dead Squid's port can
		// tell them from the clients' requests.
		probed := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.2"})
		p, err := pool.NewProber(func() []pool.Member { return members }, e.store,
			pool.ProberOptions{URL: probed.URL() + "/probe", Interval: 2 * time.Second, TLSConfig: probed.ClientTLSConfig()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	c := testutil.MustProxyClient(t, "http://"+e.addr, live.ClientTLSConfig())
	c.Transport.(*http.Transport).DisableKeepAlives = true
	for i := range 8 {
		if resp, _ := get(t, c, live.URL()+"/warm", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("warm-up request %d: %d", i, resp.StatusCode)
		}
	}

	killed := time.Now()
	for _, s := range squids {
		s.Kill()
	}
	dead := squids[3]
	carried := deadPort(t, dead.Addr(), live.Addr())
	// The fleet is down: requests fail, and every member fails some.
	for i := range 6 {
		if resp, _, err := testutil.GetAnswer(c, live.URL()+"/down", nil); err == nil && resp.StatusCode == http.StatusOK {
			t.Fatalf("request %d served while every Squid was down", i)
		}
	}
	// At most half of the members the prober holds healthy rest for their
	// failures (the store's rotation.FailureRest): one the prober already
	// found down is out by its verdict, and its rest is not counted (under
	// load the prober can get there before these requests end).
	healthy, resting, down := 0, 0, 0
	for _, m := range e.store.Members() {
		_, rests := m.Cooldowns[""]
		switch {
		case !m.Healthy:
			down++
		case rests:
			healthy++
			resting++
		default:
			healthy++
		}
	}
	if resting+down == 0 || resting > (healthy+1)/2 {
		t.Fatalf("%d of the %d healthy members rest for their failures (%d found down by the prober) with every Squid down, want 1 or more out and at most half of the healthy resting", resting, healthy, down)
	}
	time.Sleep(time.Until(killed.Add(1500 * time.Millisecond)))
	for _, s := range squids[:3] {
		s.Start()
	}

	// The members are back: every request from now on is served.
	sources := map[string]bool{}
	for i := range 20 {
		resp, a := get(t, c, live.URL()+"/back", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after the Squids were back: %d %s %q", i, resp.StatusCode, resp.Header.Get(HeaderReason), body(t, resp))
		}
		sources[a.Source] = true
	}
	// Each returned Squid serves again well within its window.
	poll.Until(t, window/2, "every returned Squid to serve again", func() error {
		resp, a := get(t, c, live.URL()+"/each", nil)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("request answered %d %s", resp.StatusCode, resp.Header.Get(HeaderReason))
		}
		sources[a.Source] = true
		for _, s := range squids[:3] {
			if !sources[s.OutgoingAddr()] {
				return fmt.Errorf("served via %v, not yet via %s", sources, s.OutgoingAddr())
			}
		}
		return nil
	})
	if time.Since(killed) > window {
		t.Fatalf("the Squids served again only %s after the blip, past the %s failure window", time.Since(killed), window)
	}
	// The Squid that never returned: once the others serve, it carries
	// nothing, and it still rests.
	before := carried.Load()
	for i := range 30 {
		if resp, _ := get(t, c, live.URL()+"/after", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with one Squid dead: %d %s", i, resp.StatusCode, resp.Header.Get(HeaderReason))
		}
	}
	if n := carried.Load() - before; n != 0 {
		t.Fatalf("the dead Squid was sent %d requests after the others served again", n)
	}
	if mw := memberWide(e.store); fmt.Sprint(mw) != "["+dead.Name()+"]" {
		t.Fatalf("members resting for every site: %v, want only the dead %s", mw, dead.Name())
	}
}
