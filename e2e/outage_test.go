package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// TestGatewaysRideOutAControllerRestart stops the only controller (memory
// store) under load through --lease-api gateways and starts a new one, as
// every upgrade of the chart does: the gateways lease from their last-known
// members meanwhile, so no request fails, with sticky and with per-request
// rotation. A ban learnt during the outage holds after the return and is in
// the new controller's view. A gateway that never reached the API refuses
// with 503 pool_unreachable, and one whose outage outlasts its grace goes
// back to refusing, saying why.
//
// The gateways reach the controller through a TCP relay on a port of its
// own, the stand-in for the controller's Service: the new controller runs
// on new free ports, as a new Pod gets a new address.
func TestGatewaysRideOutAControllerRestart(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	squids := startSquids(t, "outage", "127.0.0.71", "127.0.0.72", "127.0.0.73")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.74"})
	banSite := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.75"})

	const token = "e2e-outage-lease-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, token+"\n")
	ctlArgs := []string{"--lease-api-token-file", tokenFile, "--health-tick", "100ms"}
	ctl := startController(t, bin, env, ns, ctlArgs...)
	svc := startRelay(t)
	svc.to(ctl.leaseAPIAddr)

	names := make([]string, len(squids))
	for i, sq := range squids {
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns),
			gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names[i] = ns + "/" + px.Name
	}
	apiOf := func(addr string) *leaseapi.Client {
		c, err := leaseapi.NewClient("http://"+addr, token, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	poll.Until(t, 90*time.Second, "the lease API listing the three Proxies as healthy", func() error {
		got, err := fleetHealthy(ctx, apiOf(ctl.leaseAPIAddr))
		return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
	})

	apiURL := "http://" + svc.addr()
	gwArgs := func(extra ...string) []string {
		return poolAPIArgs(t, apiURL, token, append([]string{"--pool-refresh-interval", "500ms"}, extra...)...)
	}
	sticky := startGateway(t, bin, gwConfig{args: gwArgs()})
	perRequest := startGateway(t, bin, gwConfig{rotation: "per-request", args: gwArgs()})
	shortGrace := startGateway(t, bin, gwConfig{rotation: "per-request", args: gwArgs("--pool-outage-grace", "3s")})
	for _, g := range []*gatewayProc{sticky, perRequest, shortGrace} {
		poll.Until(t, 60*time.Second, "a gateway holding the last-known list of three members", func() error {
			v, err := gatewayStatus(g)
			return poll.Check(err == nil && v.LastKnown != nil && v.LastKnown.Members == 3, "%+v %v", v.LastKnown, err)
		})
		mustGetOK(t, g.client(t, "", nil), site.URL(), nil)
	}

	// Load: every request a new session (sticky) or a new lease
	// (per-request), so each needs the pool while the controller is away.
	var sent, failed atomic.Int64
	var failures sync.Map
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	for _, g := range []*gatewayProc{sticky, perRequest} {
		for w := range 3 {
			load.Add(1)
			go func() {
				defer load.Done()
				c := g.client(t, "", nil)
				for i := 0; ; i++ {
					select {
					case <-stopLoad:
						return
					default:
					}
					hdr := http.Header{"X-Proxyfleet-Session": {fmt.Sprintf("w%d-%d", w, i)}}
					r, err := doGet(c, site.URL(), hdr)
					sent.Add(1)
					if err != nil || r.status != http.StatusOK {
						failed.Add(1)
						failures.Store(fmt.Sprintf("%s %d %s %v", g.addr, r.status, strings.TrimSpace(r.body), err), true)
					}
				}
			}()
		}
	}
	endLoad := func() (int64, int64) {
		close(stopLoad)
		load.Wait()
		return sent.Load(), failed.Load()
	}
	time.Sleep(time.Second) // load with the controller up, for comparison

	// The controller stops, as the old Pod of an upgrade does.
	if code, err := ctl.Stop(); err != nil || code != 0 {
		t.Fatalf("stopping the controller: exit %d, %v", code, err)
	}
	svc.to("")
	sentBefore := sent.Load()
	outageStart := time.Now()

	banned := squids[0].OutgoingAddr()
	t.Run("during the outage a ban is learnt and kept", func(t *testing.T) {
		banSite.SetRule(banned, http.StatusForbidden, nil)
		c := perRequest.client(t, "", nil)
		for i := 0; banSite.Count(banned) == 0; i++ {
			if i == 30 {
				t.Fatalf("30 requests never reached %s through squid-0: %v", banSite.URL(), banSite.Counts())
			}
			// The ban is retried on another member: the client gets a 200.
			r := mustGetOK(t, c, banSite.URL(), nil)
			if r.source == banned {
				t.Fatalf("a 403 from %s reached the client", banned)
			}
		}
		at := banSite.Count(banned)
		for range 12 {
			mustGetOK(t, c, banSite.URL(), nil)
		}
		if n := banSite.Count(banned); n != at {
			t.Fatalf("squid-0 carried %d more requests to the banned site during the outage", n-at)
		}
		v, err := gatewayStatus(perRequest)
		if err != nil || v.Outage == nil || v.Outage.Refusing || len(v.Errors) == 0 || !strings.Contains(v.Errors[0], "last-known members") {
			t.Fatalf("the status page during the outage: %+v %q %v, want the outage shown, serving", v.Outage, v.Errors, err)
		}
	})

	t.Run("an outage beyond the grace is refused, saying why", func(t *testing.T) {
		c := shortGrace.client(t, "", nil)
		var last getResult
		poll.Until(t, 60*time.Second, "the 3s-grace gateway refusing", func() error {
			last = mustGet(t, c, site.URL(), nil)
			return poll.Check(last.status == http.StatusServiceUnavailable, "%s", fmt.Sprint(last.status, last.body))
		})
		if last.reason != "pool_unreachable" || !strings.Contains(last.body, "longer than the outage grace of 3s (--pool-outage-grace)") {
			t.Fatalf("beyond the grace: %d %s %q, want 503 pool_unreachable naming the grace", last.status, last.reason, last.body)
		}
	})

	t.Run("a gateway that never reached the lease API refuses", func(t *testing.T) {
		never := startGateway(t, bin, gwConfig{args: gwArgs()})
		r := mustGet(t, never.client(t, "", nil), site.URL(), nil)
		if r.status != http.StatusServiceUnavailable || r.reason != "pool_unreachable" || !strings.Contains(r.body, "no member list was received") {
			t.Fatalf("a gateway without a list: %d %s %q, want 503 pool_unreachable saying no list was received", r.status, r.reason, r.body)
		}
	})
	if t.Failed() {
		endLoad()
		t.FailNow()
	}

	// The new controller: new ports behind the same Service.
	ctl2 := startController(t, bin, env, ns, ctlArgs...)
	svc.to(ctl2.leaseAPIAddr)
	outage := time.Since(outageStart)
	api2 := apiOf(ctl2.leaseAPIAddr)
	banKey := rotation.TargetKey(banSite.Addr())

	t.Run("the ban learnt during the outage is in the new controller's view", func(t *testing.T) {
		poll.Until(t, 60*time.Second, "squid-0 resting for the banned site in the new controller", func() error {
			list, err := api2.List(ctx, leaseapi.ListFilter{})
			if err != nil {
				return err
			}
			for _, p := range list {
				if p.Name == names[0] {
					for _, cd := range p.Cooldowns {
						if cd.Target == banKey && time.Until(cd.Until) > 5*time.Minute {
							return nil
						}
					}
					return fmt.Errorf("%s cooldowns %+v", p.Name, p.Cooldowns)
				}
			}
			return errors.New(fmt.Sprint("no squid-0 in ", list))
		})
	})
	for _, g := range []*gatewayProc{sticky, perRequest, shortGrace} {
		poll.Until(t, 60*time.Second, "a gateway leasing from the new controller", func() error {
			v, err := gatewayStatus(g)
			return poll.Check(err == nil && v.Outage == nil, "%+v %v", v.Outage, err)
		})
	}
	time.Sleep(time.Second) // load with the new controller, for comparison
	total, fails := endLoad()
	t.Logf("outage of %s: %d requests through the sticky and per-request gateways (%d after the controller stopped), %d failed",
		outage.Round(time.Millisecond), total, total-sentBefore, fails)
	if fails != 0 {
		var some []string
		failures.Range(func(k, _ any) bool { some = append(some, k.(string)); return len(some) < 5 })
		t.Fatalf("%d of %d requests failed across the controller restart, e.g. %q", fails, total, some)
	}

	t.Run("after the return the ban holds", func(t *testing.T) {
		at := banSite.Count(banned)
		for _, g := range []*gatewayProc{perRequest, sticky} {
			c := g.client(t, "", nil)
			for i := range 8 {
				mustGetOK(t, c, banSite.URL(), http.Header{"X-Proxyfleet-Session": {fmt.Sprint("after-", i)}})
			}
		}
		if n := banSite.Count(banned); n != at {
			t.Fatalf("squid-0 carried %d requests to the banned site after the controller returned", n-at)
		}
		if r := mustGetOK(t, shortGrace.client(t, "", nil), site.URL(), nil); strings.HasPrefix(r.lease, "local-") {
			t.Fatalf("after the return the 3s-grace gateway leased %s itself", r.lease)
		}
	})
	if n := counterSum(t, perRequest.metricsAddr, "proxyfleet_gateway_pool_outages_total"); n != 1 {
		t.Errorf("the per-request gateway counted %v outages, want 1", n)
	}
	if n := counterSum(t, perRequest.metricsAddr, "proxyfleet_gateway_pool_last_known_leases_total"); n == 0 {
		t.Errorf("the per-request gateway counted no last-known leases")
	}
}

// gatewayStatus reads a gateway's status JSON.
func gatewayStatus(g *gatewayProc) (statuspage.GatewayView, error) {
	var v statuspage.GatewayView
	resp, err := http.Get("http://" + g.metricsAddr + statuspage.JSONPath)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET %s: %s", statuspage.JSONPath, resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// relay is a TCP forwarder on a loopback port of its own to whichever
// address it is told, the stand-in for a Service in front of the
// controller; with none, it closes every connection at once, as a Service
// without ready endpoints refuses them.
type relay struct {
	ln     net.Listener
	target atomic.Pointer[string]
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func startRelay(t *testing.T) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, conns: map[net.Conn]bool{}}
	r.to("")
	go r.serve()
	t.Cleanup(func() {
		ln.Close()
		r.to("")
	})
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

// to sends new connections to addr and ends the ones to the old address.
func (r *relay) to(addr string) {
	r.target.Store(&addr)
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
	r.mu.Unlock()
}

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.pipe(c)
	}
}

func (r *relay) pipe(c net.Conn) {
	addr := *r.target.Load()
	if addr == "" {
		c.Close()
		return
	}
	b, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.conns[c], r.conns[b] = true, true
	r.mu.Unlock()
	go func() {
		_, _ = io.Copy(b, c)
		b.Close()
	}()
	_, _ = io.Copy(c, b)
	c.Close()
}
