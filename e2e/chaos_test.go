package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// chaosLoad is one client's stream of requests through a gateway, counting
// what did not come back as the site's answer.
type chaosLoad struct {
	name         string
	ok, failed   atomic.Int64
	mu           sync.Mutex
	fails        []string
	insideTunnel atomic.Int64 // a request inside an established tunnel cut off (not a failed new tunnel)
}

func (l *chaosLoad) fail(msg string) {
	l.failed.Add(1)
	l.mu.Lock()
	if len(l.fails) < 5 {
		l.fails = append(l.fails, time.Now().Format("15:04:05.000")+" "+msg)
	}
	l.mu.Unlock()
}

// plainGets sends idempotent GETs through the gateway at addr until stop.
func (l *chaosLoad) plainGets(t *testing.T, addr func() string, target string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c := testutil.MustProxyClient(t, "http://"+addr(), nil)
		c.Transport.(*http.Transport).DisableKeepAlives = true
		r, err := doGet(c, target+"/chaos", nil)
		switch {
		case err != nil:
			l.fail(err.Error())
		case r.status != http.StatusOK || r.source == "":
			l.fail(fmt.Sprintf("%d %s %s", r.status, r.reason, strings.TrimSpace(r.body)))
		default:
			l.ok.Add(1)
		}
	}
}

// newTunnels opens a new CONNECT tunnel per request through the gateway
// at addr until stop: the CONNECT must be answered 200 (a failed new
// tunnel otherwise); the request inside is then sent through it.
func (l *chaosLoad) newTunnels(addr func() string, tlsTarget *testutil.Target, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		conn, resp, err := testutil.ConnectTunnel(addr(), tlsTarget.Addr(), nil, 30*time.Second)
		if err != nil {
			l.fail("CONNECT: " + err.Error())
			continue
		}
		if resp.StatusCode != http.StatusOK {
			l.fail(fmt.Sprintf("CONNECT: %d %s", resp.StatusCode, resp.Header.Get(hdrReason))) // conn is nil then
			continue
		}
		l.ok.Add(1)
		tc := tls.Client(conn, tlsTarget.ClientTLSConfig())
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(tc, "GET /tunnel HTTP/1.1\r\nHost: "+tlsTarget.Addr()+"\r\nConnection: close\r\n\r\n"); err != nil {
			l.insideTunnel.Add(1)
		} else if b, err := io.ReadAll(tc); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 200") {
			l.insideTunnel.Add(1)
		}
		tc.Close()
	}
}

// TestChaos does at once what each piece is tested for alone: two gateways
// on one Redis lease store (AOF) in front of four real Squids, under plain
// and tunnel load, while the Squids are killed -9 one after another and
// restarted, Redis is killed -9 and restarted, and one gateway is
// restarted (its clients wait; the other gateway's go on). No idempotent
// GET and no new tunnel fails, and a ban learnt before the chaos still
// holds after it.
func TestChaos(t *testing.T) {
	bin := testutil.BuildBinary(t)
	rd := redis.Start(t, redis.Options{})
	squids := startSquids(t, "chaos", "127.0.0.141", "127.0.0.142", "127.0.0.143", "127.0.0.144")
	plain := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	secure := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	banSite := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.145"})
	banned := squids[0]
	banSite.SetRule(banned.OutgoingAddr(), http.StatusForbidden, nil)

	gwArgs := []string{"--lease-store", rd.URL(), "--lease-store-prefix", "chaos", "--retries", "3", "--failure-cooldown", "30s"}
	cfg := gwConfig{upstreams: squidURLs(squids), rotation: "request", args: gwArgs}
	var gwA, gwB atomic.Pointer[gatewayProc]
	gwA.Store(startGateway(t, bin, cfg))
	gwB.Store(startGateway(t, bin, cfg))
	addrA := func() string { return gwA.Load().addr }
	addrB := func() string { return gwB.Load().addr }

	// The ban, learnt before the chaos: the site refuses the first Squid.
	peek, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: rd.URL(), Prefix: "chaos"})
	if err != nil {
		t.Fatal(err)
	}
	defer peek.Close()
	cB := gwB.Load().client(t, "", nil)
	bannedFor := func() error {
		cds, err := peek.ListCooldowns(context.Background())
		if err != nil {
			return err
		}
		for _, cd := range cds {
			// A member named by --upstream is its host:port.
			if cd.Member == banned.Addr() && cd.Target == "127.0.0.145" && cd.Reason == "banned" {
				return nil
			}
		}
		return fmt.Errorf("no ban of %s for the ban site in Redis: %+v", banned.Name(), cds)
	}
	poll.Until(t, 30*time.Second, "the ban of the first Squid by the ban site", func() error {
		if r := mustGet(t, cB, "http://"+banSite.Addr()+"/before", nil); r.status != http.StatusOK {
			return fmt.Errorf("the ban site through B: %d %s", r.status, r.reason)
		}
		return bannedFor()
	})

	loads := map[string]*chaosLoad{}
	stop, stopA := make(chan struct{}), make(chan struct{})
	var wg, wgA sync.WaitGroup
	for _, gw := range []struct {
		name string
		addr func() string
		stop chan struct{}
		wg   *sync.WaitGroup
	}{{"A", addrA, stopA, &wgA}, {"B", addrB, stop, &wg}} {
		pl, tn := &chaosLoad{name: gw.name + " plain"}, &chaosLoad{name: gw.name + " tunnels"}
		loads[pl.name], loads[tn.name] = pl, tn
		gw.wg.Go(func() { pl.plainGets(t, gw.addr, "http://"+plain.Addr(), gw.stop) })
		gw.wg.Go(func() { tn.newTunnels(gw.addr, secure, gw.stop) })
	}

	restartSquid := func(sq *squid.Squid) {
		sq.Kill()
		time.Sleep(1500 * time.Millisecond)
		sq.Start()
	}
	time.Sleep(time.Second)
	restartSquid(squids[1])
	restartSquid(squids[0])
	// Redis, killed -9 and back from its AOF.
	if err := rd.Kill(); err != nil {
		t.Fatal(err)
	}
	restartSquid(squids[2])
	rd.Start()
	restartSquid(squids[3])
	// Gateway A restarted: its clients wait, B's go on.
	close(stopA)
	wgA.Wait()
	if _, err := gwA.Load().Stop(); err != nil {
		t.Fatal(err)
	}
	gwA.Store(startGateway(t, bin, cfg))
	stopA2 := make(chan struct{})
	for _, name := range []string{"A plain", "A tunnels"} {
		l := loads[name]
		if strings.HasSuffix(name, "plain") {
			wgA.Go(func() { l.plainGets(t, addrA, "http://"+plain.Addr(), stopA2) })
		} else {
			wgA.Go(func() { l.newTunnels(addrA, secure, stopA2) })
		}
	}
	restartSquid(squids[1])
	time.Sleep(2 * time.Second)
	close(stop)
	close(stopA2)
	wg.Wait()
	wgA.Wait()

	for _, name := range []string{"A plain", "A tunnels", "B plain", "B tunnels"} {
		l := loads[name]
		t.Logf("%s: %d served, %d failed, %d cut inside an established tunnel", name, l.ok.Load(), l.failed.Load(), l.insideTunnel.Load())
		if l.failed.Load() != 0 {
			t.Errorf("%s: %d failed (first: %v)", name, l.failed.Load(), l.fails)
		}
		if l.ok.Load() < 20 {
			t.Errorf("%s: only %d served: no load to speak of", name, l.ok.Load())
		}
	}

	// The ban learnt before the chaos holds after it: in Redis, and the
	// banned Squid carries nothing more to the ban site.
	if err := bannedFor(); err != nil {
		t.Fatal(err)
	}
	before := banSite.Count(banned.OutgoingAddr())
	cA := gwA.Load().client(t, "", nil)
	for i := range 10 {
		for _, c := range []*http.Client{cA, cB} {
			if r := mustGet(t, c, "http://"+banSite.Addr()+"/after", nil); r.status != http.StatusOK || r.source == banned.OutgoingAddr() {
				t.Fatalf("ban site after the chaos, request %d: %d via %s", i, r.status, r.source)
			}
		}
	}
	if n := banSite.Count(banned.OutgoingAddr()) - before; n != 0 {
		t.Fatalf("the banned Squid carried %d requests to the ban site after the chaos", n)
	}
}
