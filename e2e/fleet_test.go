package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestFleet is the end-to-end run of a health-checked fleet: the real
// `proxyfleet controller` against a real API server, three real Squids
// (egress 127.0.0.2, .3 and .4) as External Proxies, two real gateways in
// --lease-api mode leasing from the controller, and a Managed Proxy of the
// kubernetes provider whose Pod a kubelet stand-in runs.
//
// One controller and one set of Squids serve every step, so the steps run in
// the order written and each builds on the state the previous one left; a
// failed step stops the rest (their failures would only be echoes).
//
//  1. the Proxies turn Ready and the lease API lists them;
//  8. the steady fleet gets no Proxy status write over ten probe intervals
//     (right after 1, while nothing else changes);
//  2. a gateway rotates across the three;
//  3. a 429 gateway A saw is a cooldown gateway B respects;
//  4. a killed Squid goes Unhealthy and out of use, and comes back;
//  5. a Managed Proxy's Pod, run by the kubelet stand-in, is Ready and leased.
func TestFleet(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ctx := context.Background()
	ns, podNS := env.Namespace(t), env.Namespace(t)

	squids := startSquids(t, "fleet", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	// Probes go to a target of their own on 127.0.0.1; crawler traffic goes
	// to sites on other addresses (a gateway's target key is the host, so
	// distinct hosts are distinct targets for cooldowns).
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	siteA := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.5"})
	siteB := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.6"})
	siteC := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.7"})

	const token = "e2e-fleet-lease-token"
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "lease-api-token")
	writeFile(t, tokenFile, "# the controller's lease API token\n"+token+"\n")
	providersCfg := filepath.Join(dir, "providers.yaml")
	writeFile(t, providersCfg, "providers:\n  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      namespace: "+podNS+"\n")
	ctl := startController(t, bin, env, ns, "--providers-config", providersCfg,
		"--lease-api-token-file", tokenFile, "--health-tick", "100ms")
	api, err := leaseapi.NewClient("http://"+ctl.leaseAPIAddr, token, nil)
	if err != nil {
		t.Fatal(err)
	}

	names := make([]string, len(squids)) // lease API member names, "<ns>/<name>"
	for i, sq := range squids {
		// An External Proxy at the Squid, probed every second through it.
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns),
			gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyAttributes(map[string]string{"squid": fmt.Sprint(i)}),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names[i] = ns + "/" + px.Name
	}
	proxyName := func(i int) string { return fmt.Sprintf("squid-%d", i) }

	// step runs one scenario; the later ones build on it, so a failure stops the test.
	step := func(name string, f func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	step("1 three External Proxies at three Squids turn Ready and the lease API lists them", func(t *testing.T) {
		for i := range squids {
			p := waitProxy(t, env.Client, ns, proxyName(i), "Ready", fleetReady)
			if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy); c.Reason != v1alpha1.ReasonProbeSucceeded {
				t.Errorf("%s: Healthy condition %+v, want reason %s", p.Name, c, v1alpha1.ReasonProbeSucceeded)
			}
		}
		poll.Until(t, 30*time.Second, "the lease API listing the three Proxies as healthy", func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
		})
		all, err := api.List(ctx, leaseapi.ListFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for i, sq := range squids {
			p := fleetFind(all, names[i])
			if p == nil || p.URL != sq.URL() || !p.Healthy || p.LatencyMillis <= 0 || p.Attributes["squid"] != strconv.Itoa(i) {
				t.Errorf("lease API lists %s as %+v; want %s, healthy, with its latency and attributes", names[i], p, sq.URL())
			}
		}
		// The list is behind the bearer token.
		if code, _, err := httpGet("http://" + ctl.leaseAPIAddr + "/v1/proxies"); err != nil || code != http.StatusUnauthorized {
			t.Errorf("GET /v1/proxies without the token: %d %v, want 401", code, err)
		}
	})

	step("8 a steady healthy fleet gets no Proxy status write over ten probe intervals", func(t *testing.T) {
		// Probed every second (tick 100ms): 10 intervals, plus one for slack.
		const window = 11 * time.Second
		w, err := fleetWatchProxies(ctx, env, ns)
		if err != nil {
			t.Fatal(err)
		}
		before := probe.Counts()
		wctx, cancel := context.WithTimeout(ctx, window)
		defer cancel()
		events := w.collect(wctx)
		after := w.list(t, ctx)
		for name, rv := range w.start {
			if after[name] != rv {
				t.Errorf("Proxy %s: resourceVersion %s -> %s during the steady window", name, rv, after[name])
			}
		}
		if len(events) > 0 {
			t.Errorf("%d Proxy writes during the steady window, the first: %v", len(events), events[:min(len(events), 6)])
		}
		// The engine kept probing all along: silence must not come from idleness.
		now := probe.Counts()
		for _, sq := range squids {
			src := sq.OutgoingAddr()
			if n := now[src] - before[src]; n < 8 {
				t.Errorf("only %d probes through %s in %s; the engine should probe it every second", n, sq.Name(), window)
			}
		}
		if t.Failed() {
			return
		}
		t.Logf("no Proxy write in %s while the probe target saw %v probes", window, fleetDiff(before, now))
	})

	poolArgs := func(extra ...string) []string { return poolAPIArgs(t, "http://"+ctl.leaseAPIAddr, token, extra...) }
	gwA := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolArgs()})
	gwB := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolArgs()})
	cA, cB := gwA.client(t, "", nil), gwB.client(t, "", nil)

	step("2 a pool-api gateway rotating per request spreads traffic across the three Squids", func(t *testing.T) {
		got := fleetSend(t, cA, siteB.URL()+"/rotate", 9)
		if srcs := keys(got); !slices.Equal(srcs, outgoingAddrs(squids)) {
			t.Fatalf("siteB saw sources %v (%v), want all of %v", srcs, got, outgoingAddrs(squids))
		}
	})

	step("3 a 429 gateway A reported is a cooldown gateway B respects for that target only", func(t *testing.T) {
		banned, member := squids[0].OutgoingAddr(), names[0]
		siteA.SetRule(banned, http.StatusTooManyRequests, map[string]string{"Retry-After": "30"})
		defer siteA.ClearRule(banned)
		t0 := time.Now()
		before := siteA.Count(banned)
		for i := 0; siteA.Count(banned) == before; i++ {
			if i == 9 {
				t.Fatalf("9 requests through A never went through %s: %v", banned, siteA.Counts())
			}
			r := mustGet(t, cA, siteA.URL()+"/a", nil)
			// A may retry the 429 on another upstream, or hand it over.
			if !(r.status == http.StatusOK && r.source != banned) && !(r.status == http.StatusTooManyRequests && r.source == banned) {
				t.Fatalf("A answered %d from %q (reason %q): %s", r.status, r.source, r.reason, r.body)
			}
		}
		// A reported it: the controller holds a cooldown of that member for
		// that target (the target key is the host), as long as Retry-After.
		var cd leaseapi.CooldownInfo
		poll.Until(t, 30*time.Second, "a cooldown of "+member+" for 127.0.0.5 in the lease API", func() error {
			ps, err := api.List(ctx, leaseapi.ListFilter{})
			if err != nil {
				return err
			}
			p := fleetFind(ps, member)
			if p == nil {
				return errors.New("not listed")
			}
			for _, c := range p.Cooldowns {
				if c.Target == siteA.Host() {
					cd = c
					return nil
				}
			}
			return fmt.Errorf("cooldowns %+v", p.Cooldowns)
		})
		if lo, hi := t0.Add(25*time.Second), time.Now().Add(31*time.Second); cd.Until.Before(lo) || cd.Until.After(hi) {
			t.Errorf("cooldown until %s, want about 30s (Retry-After) after the 429: between %s and %s", cd.Until, lo, hi)
		}

		// Gateway B, a process that never saw the 429, avoids the member for siteA...
		afterA := siteA.Count(banned)
		got := fleetSend(t, cB, siteA.URL()+"/b", 9)
		if n := siteA.Count(banned) - afterA; n != 0 {
			t.Fatalf("B sent %d requests to siteA through %s, which is cooling down for it", n, member)
		}
		if srcs, want := keys(got), fleetWithout(outgoingAddrs(squids), banned); !slices.Equal(srcs, want) {
			t.Errorf("B reached siteA from %v, want from %v", srcs, want)
		}
		// ...and still uses it for another target.
		if got := fleetSend(t, cB, siteB.URL()+"/b", 9); got[banned] == 0 {
			t.Fatalf("B never used %s for siteB (%v): the cooldown is for siteA only", banned, got)
		}
	})

	step("4 a killed Squid's Proxy turns Unhealthy, leaves the pool, and returns when restarted", func(t *testing.T) {
		const victim = 2
		sq, member, name := squids[victim], names[victim], proxyName(victim)
		others := fleetWithout(outgoingAddrs(squids), sq.OutgoingAddr())
		killed := time.Now()
		sq.Kill()
		// failureThreshold 3 × interval 1s + one tick 100ms in theory; the
		// deadline is generous for a busy 2-core box, the time only logged.
		p := fleetWaitProxy(t, env, ns, name, 60*time.Second, "Unhealthy", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhaseUnhealthy &&
				meta.IsStatusConditionFalse(p.Status.Conditions, v1alpha1.ConditionHealthy)
		})
		t.Logf("%s Unhealthy %s after the kill (failureThreshold 3 × 1s + tick 100ms = 3.1s)", name, time.Since(killed).Round(time.Millisecond))
		if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy); c.Reason != v1alpha1.ReasonProbeFailed || c.Message == "" {
			t.Errorf("Healthy condition %+v, want reason %s with the probe's error", c, v1alpha1.ReasonProbeFailed)
		}
		poll.Until(t, 30*time.Second, "the lease API no longer offering "+member, func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, fleetWithout(names, member)), "%s", fmt.Sprint(got, err))
		})
		for gw, c := range map[string]*http.Client{"A": cA, "B": cB} {
			got := fleetSend(t, c, siteC.URL()+"/down", 6)
			if srcs := keys(got); !slices.Equal(srcs, others) {
				t.Errorf("gateway %s reached siteC from %v with %s down, want from %v", gw, srcs, sq.Name(), others)
			}
		}

		restarted := time.Now()
		sq.Start()
		fleetWaitProxy(t, env, ns, name, 60*time.Second, "Ready again", fleetReady)
		t.Logf("%s Ready %s after the restart", name, time.Since(restarted).Round(time.Millisecond))
		poll.Until(t, 30*time.Second, "the lease API offering "+member+" again", func() error {
			got, err := fleetHealthy(ctx, api)
			return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
		})
		for gw, c := range map[string]*http.Client{"A": cA, "B": cB} {
			poll.Until(t, 30*time.Second, "gateway "+gw+" using "+sq.Name()+" again", func() error {
				r, err := doGet(c, siteC.URL()+"/up", nil)
				if err != nil || r.status != http.StatusOK {
					return fmt.Errorf("%d %q %v", r.status, r.body, err)
				}
				return poll.Check(r.source == sq.OutgoingAddr(), "last source %s", r.source)
			})
		}
	})

	step("5 a Managed Proxy of the kubernetes provider is Ready on the Squid the kubelet stand-in runs, and leased through", func(t *testing.T) {
		const podIP, egress = "127.0.0.8", "127.0.0.9"
		port := fleetPortOn(t, podIP)
		px := gen.Proxy("managed", gen.SetProxyNamespace(ns), gen.SetProxyProvider("in-cluster"), gen.SetProxyPort(int32(port)),
			gen.SetProxyAttributes(map[string]string{"kind": "managed"}),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		member := ns + "/" + px.Name
		var pod corev1.Pod
		podKey := types.NamespacedName{Namespace: podNS, Name: providers.NameFromUID(string(px.UID))}
		poll.Until(t, pollTimeout, "the Squid Pod "+podKey.String(), func() error {
			err := env.Client.Get(ctx, podKey, &pod)
			return poll.Check(err == nil, "%v", err)
		})

		// KUBELET STAND-IN: envtest runs no kubelet, so this test does what
		// one would for the Pod — run a real Squid on the Pod's container
		// port at the Pod's IP, then write the Pod's status. It runs
		// testutil's squid.conf, not the one in the Pod's annotation: that
		// one denies loopback destinations, and every target here is on
		// loopback.
		if len(pod.Spec.Containers) != 1 || len(pod.Spec.Containers[0].Ports) != 1 {
			t.Fatalf("kubelet stand-in: Pod %s has containers %+v, want one with one port", pod.Name, pod.Spec.Containers)
		}
		containerPort := int(pod.Spec.Containers[0].Ports[0].ContainerPort)
		if containerPort != port {
			t.Fatalf("kubelet stand-in: the Pod's container port is %d, want spec.port %d", containerPort, port)
		}
		podSquid := squid.Start(t, squid.Options{
			Name: "kubelet-stand-in-" + pod.Name, ListenIP: podIP, Port: containerPort, OutgoingAddr: egress,
		})
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = podIP
		pod.Status.PodIPs = []corev1.PodIP{{IP: podIP}}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if err := env.Client.Status().Update(ctx, &pod); err != nil {
			t.Fatalf("kubelet stand-in: write the Pod's status: %v", err)
		}

		p := waitProxy(t, env.Client, ns, px.Name, "Ready at the Pod IP", func(p *v1alpha1.Proxy) bool {
			return p.Status.IP == podIP && fleetReady(p)
		})
		t.Logf("%s Ready at %s:%d (latency %dms)", member, p.Status.IP, port, p.Status.LatencyMillis)

		// Leased through the lease API: the lease's URL is the Pod's Squid,
		// and a request through it leaves from that Squid's egress.
		var lease pool.Lease
		poll.Until(t, 30*time.Second, "a lease of "+member, func() error {
			var err error
			lease, err = api.Acquire(ctx, pool.AcquireRequest{Proxy: member, Target: siteB.Host()})
			return poll.Check(err == nil, "%v", err)
		})
		if lease.Member.URL == nil || lease.Member.URL.String() != podSquid.URL() {
			t.Fatalf("lease of %s has URL %v, want %s", member, lease.Member.URL, podSquid.URL())
		}
		direct := testutil.MustProxyClient(t, lease.Member.URL.String(), nil)
		if r := mustGetOK(t, direct, siteB.URL()+"/leased", nil); r.source != egress {
			t.Errorf("through the leased URL siteB saw %s, want the Pod Squid's %s", r.source, egress)
		}
		if err := api.Release(ctx, lease.ID); err != nil {
			t.Errorf("release: %v", err)
		}

		// Leased through a gateway: pinned by X-Proxyfleet-Proxy, named in the answer.
		r := mustGetOK(t, cA, siteB.URL()+"/pinned", http.Header{hdrProxy: {member}})
		if r.proxy != member || r.source != egress {
			t.Errorf("gateway answer named %q from %s, want %s from %s", r.proxy, r.source, member, egress)
		}
	})
}

// fleetReady is a Proxy the lease API offers: phase Ready, a latency, Healthy=True.
func fleetReady(p *v1alpha1.Proxy) bool {
	return p.Status.Phase == v1alpha1.PhaseReady && p.Status.LatencyMillis > 0 &&
		meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
}

// fleetWaitProxy is waitProxy with a deadline of its own.
func fleetWaitProxy(t *testing.T, env *testenv.Env, ns, name string, timeout time.Duration, what string, cond func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	t.Helper()
	var p v1alpha1.Proxy
	poll.Until(t, timeout, name+": "+what, func() error {
		if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		return poll.Check(cond(&p), "phase=%s latency=%d conditions=%+v", p.Status.Phase, p.Status.LatencyMillis, p.Status.Conditions)
	})
	return &p
}

// fleetHealthy lists the names the lease API offers (healthy=true), sorted.
func fleetHealthy(ctx context.Context, api *leaseapi.Client) ([]string, error) {
	ps, err := api.List(ctx, leaseapi.ListFilter{HealthyOnly: true})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out, nil
}

// fleetFind returns the listed member called name, or nil.
func fleetFind(ps []leaseapi.ProxyInfo, name string) *leaseapi.ProxyInfo {
	for i := range ps {
		if ps[i].Name == name {
			return &ps[i]
		}
	}
	return nil
}

// fleetSend sends n GETs through c, each of which must be a 200 from the
// target, and counts them by the source address the target saw.
func fleetSend(t *testing.T, c *http.Client, url string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		got[mustGetOK(t, c, url, nil).source]++
	}
	return got
}

// fleetWithout returns the sorted list minus drop.
func fleetWithout(list []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return s == drop })
}

// fleetDiff is after minus before per key.
func fleetDiff(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

// fleetPortOn returns a port that was free on ip a moment ago. The Squid
// started on it retries while it is taken, so a race costs time, not a flake.
func fleetPortOn(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
