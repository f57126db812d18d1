package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestControllerLeaseAPIFeedsPoolAPIGateways runs the real controller over
// three External Proxies at three real Squids, and two real gateways in
// --pool-api mode leasing from it: the Proxies turn Ready, the lease API
// offers them, a gateway rotates across them, and a 429 one gateway sees is
// a cooldown the other respects.
func TestControllerLeaseAPIFeedsPoolAPIGateways(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	squids := startSquids(t, "leaseapi", "127.0.0.61", "127.0.0.62", "127.0.0.63")
	// Probes go to a target of their own, so the site below counts only
	// crawler traffic per source address.
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.64"})

	const apiToken = "e2e-lease-api-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, "# the controller's lease API token\n"+apiToken+"\n")
	ctl := startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--health-tick", "100ms")

	regions := []string{"eu", "eu", "us"}
	var names []string
	for i, sq := range squids {
		px := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("squid-%d", i)},
			Spec: v1alpha1.ProxySpec{
				Mode:       v1alpha1.ModeExternal,
				Endpoint:   &v1alpha1.Endpoint{Host: "127.0.0.1", Port: int32(sq.Port())},
				Attributes: map[string]string{"region": regions[i], "squid": strconv.Itoa(i)},
				HealthCheck: v1alpha1.HealthCheck{
					URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1,
				},
			},
		}
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names = append(names, ns+"/"+px.Name)
	}

	t.Run("the Proxies turn Ready and the lease API offers them", func(t *testing.T) {
		for i := range squids {
			waitProxy(t, env.Client, ns, fmt.Sprintf("squid-%d", i), "Ready and Healthy", func(p *v1alpha1.Proxy) bool {
				return p.Status.Phase == v1alpha1.PhaseReady && p.Status.LatencyMillis > 0 &&
					meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
			})
		}
		c, err := pool.NewClient("http://"+ctl.leaseAPIAddr, apiToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		poll(t, "the lease API listing the three Proxies as healthy", func() (bool, string) {
			ps, err := c.List(ctx, pool.ListFilter{HealthyOnly: true})
			if err != nil {
				return false, err.Error()
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.Name)
			}
			return slices.Equal(got, names), fmt.Sprint(got)
		})
		eu, err := c.List(ctx, pool.ListFilter{Attributes: map[string]string{"region": "eu"}})
		if err != nil || len(eu) != 2 || eu[0].URL != squids[0].URL() || eu[0].LatencyMillis <= 0 {
			t.Fatalf("attr.region=eu lists %+v (%v), want squid-0 and squid-1 with their URLs and latency", eu, err)
		}
	})

	poolArgs := func(extra ...string) []string {
		p := filepath.Join(t.TempDir(), "pool-token")
		writeFile(t, p, apiToken+"\n")
		return append([]string{"--pool-api", "http://" + ctl.leaseAPIAddr, "--pool-token-file", p}, extra...)
	}
	gwA := startGateway(t, bin, gwConfig{args: poolArgs()})
	gwB := startGateway(t, bin, gwConfig{rotation: "per-request", args: poolArgs()})

	t.Run("a gateway in --pool-api mode rotates across the Proxies", func(t *testing.T) {
		c := gwB.client(t, "", nil)
		for range 9 {
			mustGetOK(t, c, site.URL()+"/rotate", nil)
		}
		if got, want := site.Sources(), outgoingAddrs(squids); !slices.Equal(got, want) {
			t.Fatalf("the site saw sources %v, want all of %v", got, want)
		}
	})

	t.Run("a 429 through gateway A is a cooldown gateway B respects", func(t *testing.T) {
		banned := squids[0].OutgoingAddr()
		site.SetRule(banned, http.StatusTooManyRequests, nil)
		before := site.Count(banned)
		cA := gwA.client(t, "", nil)
		for i := 0; site.Count(banned) == before; i++ {
			if i == 20 {
				t.Fatalf("20 sessions through A never went through %s: %v", banned, site.Counts())
			}
			r := mustGetOK(t, cA, site.URL()+"/a", map[string][]string{"X-Proxyfleet-Session": {fmt.Sprintf("a%d", i)}})
			if r.source == banned {
				t.Fatalf("A delivered the 429 of %s instead of retrying elsewhere", banned)
			}
		}
		after := site.Count(banned)
		cB := gwB.client(t, "", nil)
		for range 9 {
			if r := mustGetOK(t, cB, site.URL()+"/b", nil); r.source == banned {
				t.Fatalf("B went through %s, which A got a 429 from", banned)
			}
		}
		if n := site.Count(banned); n != after {
			t.Fatalf("B sent %d requests through the cooled-down %s", n-after, banned)
		}
	})

	t.Run("the controller counts lease requests and exports the pool gauges", func(t *testing.T) {
		_, body, err := httpGet("http://" + ctl.metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`proxyfleet_lease_requests_total\{outcome="granted"\} [1-9]`).MatchString(body) ||
			!strings.Contains(body, `proxyfleet_members{healthy="true"} 3`) ||
			!regexp.MustCompile(`proxyfleet_cooldowns_active [1-9]`).MatchString(body) {
			t.Fatalf("controller /metrics lacks the lease series:\n%s", strings.Join(grepLines(body, "proxyfleet_"), "\n"))
		}
	})
}
