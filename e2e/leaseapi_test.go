package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestControllerLeaseAPIAttributesAndMetrics runs the real controller over
// three External Proxies at three real Squids and checks what TestFleet does
// not: attribute selectors on the lease API's list and leases, and the
// controller's own /metrics (lease requests by outcome, the scrape-time pool
// and Proxy-phase gauges, the per-Proxy probe series and their removal when
// a Proxy is deleted). Rotation through --lease-api gateways and the shared
// cooldown are TestFleet's scenarios 2 and 3.
func TestControllerLeaseAPIAttributesAndMetrics(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	squids := startSquids(t, "leaseapi", "127.0.0.61", "127.0.0.62", "127.0.0.63")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})

	const apiToken = "e2e-lease-api-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, "# the controller's lease API token\n"+apiToken+"\n")
	ctl := startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--health-tick", "100ms")
	api, err := leaseapi.NewClient("http://"+ctl.leaseAPIAddr, apiToken, nil)
	if err != nil {
		t.Fatal(err)
	}

	regions := []string{"eu", "eu", "us"}
	var names []string
	for i, sq := range squids {
		px := gen.Proxy(fmt.Sprintf("squid-%d", i), gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyAttributes(map[string]string{"region": regions[i], "squid": strconv.Itoa(i)}),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		names = append(names, ns+"/"+px.Name)
	}
	for i := range squids {
		waitProxy(t, env.Client, ns, fmt.Sprintf("squid-%d", i), "Ready and Healthy", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
		})
	}
	poll.Until(t, pollTimeout, "the lease API offering the three Proxies", func() error {
		got, err := fleetHealthy(ctx, api)
		return poll.Check(err == nil && slices.Equal(got, names), "%s", fmt.Sprint(got, err))
	})

	t.Run("attribute selectors filter the list and the leases", func(t *testing.T) {
		eu, err := api.List(ctx, leaseapi.ListFilter{Attributes: map[string]string{"region": "eu"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(eu) != 2 || eu[0].Name != names[0] || eu[1].Name != names[1] ||
			eu[0].URL != squids[0].URL() || eu[0].LatencyMillis <= 0 {
			t.Fatalf("attr.region=eu lists %+v, want squid-0 and squid-1 with their URLs and latency", eu)
		}
		us, err := api.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "us"}, Target: "site.example"})
		if err != nil || us.Member.Name != names[2] {
			t.Fatalf("a lease for region=us: %+v %v, want %s", us, err, names[2])
		}
		// Two eu leases go to the two eu Proxies: fewest active leases first.
		var got []string
		for range 2 {
			l, err := api.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, l.Member.Name)
		}
		if slices.Sort(got); !slices.Equal(got, names[:2]) {
			t.Fatalf("two region=eu leases went to %v, want %v", got, names[:2])
		}
		var nm *pool.NoMatchError
		if _, err := api.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "mars"}}); !errors.As(err, &nm) || nm.Considered != 0 {
			t.Fatalf("a lease for region=mars: %v, want a 409 with nothing considered", err)
		}
		// The us lease's 429 cools squid-2 down for its target; then it is returned.
		if err := api.Report(ctx, us.ID, pool.Report{Result: rotation.ResultRateLimited}); err != nil {
			t.Fatal(err)
		}
		if err := api.Release(ctx, us.ID); err != nil {
			t.Fatal(err)
		}
	})

	scrape := func() string {
		t.Helper()
		code, body, err := httpGet("http://" + ctl.metricsAddr + "/metrics")
		if err != nil || code != 200 {
			t.Fatalf("GET /metrics: %d %v", code, err)
		}
		return body
	}
	has := func(body string, lines ...string) []string {
		var missing []string
		for _, l := range lines {
			if !slices.Contains(strings.Split(body, "\n"), l) {
				missing = append(missing, l)
			}
		}
		return missing
	}

	t.Run("the controller exports lease requests by outcome and the scrape-time gauges", func(t *testing.T) {
		body := scrape()
		if missing := has(body,
			`proxyfleet_lease_requests_total{outcome="granted"} 3`,
			`proxyfleet_lease_requests_total{outcome="no_match"} 1`,
			`proxyfleet_leases_active 2`,
			`proxyfleet_cooldowns_active 1`,
			`proxyfleet_members{healthy="true"} 3`,
			`proxyfleet_proxies{phase="Ready"} 3`,
			`proxyfleet_proxies{phase="Unhealthy"} 0`,
		); len(missing) > 0 {
			t.Fatalf("controller /metrics lacks %q; its proxyfleet_ lines:\n%s", missing, strings.Join(grepLines(body, "proxyfleet_"), "\n"))
		}
		// Every probe is observed, a failure counter included (at zero for a
		// healthy Proxy: what failure-ratio alerts divide by).
		for _, series := range []string{"proxyfleet_healthcheck_duration_seconds_count", "proxyfleet_healthcheck_failures_total"} {
			if !strings.Contains(body, series+`{proxy="`+names[2]+`"} `) {
				t.Fatalf("no %s series for %s:\n%s", series, names[2], strings.Join(grepLines(body, "proxyfleet_healthcheck"), "\n"))
			}
		}
	})

	t.Run("a deleted Proxy leaves the phase gauge and takes its probe series along", func(t *testing.T) {
		if err := env.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "squid-2"}}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, pollTimeout, "squid-2 gone from /metrics", func() error {
			body := scrape()
			missing := has(body, `proxyfleet_proxies{phase="Ready"} 2`, `proxyfleet_members{healthy="true"} 2`)
			series := grepLines(body, `proxy="`+names[2]+`"`)
			return poll.Check(len(missing) == 0 && len(series) == 0, "missing %q, still there %q", missing, series)
		})
	})
}
