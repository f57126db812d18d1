package manager

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// TestProxyCollectorCountsTheCacheByPhase wires the collector as the
// controller does, over a real manager cache with no reconciler (so the
// phases written here stay), and checks every scrape reads the cache anew.
func TestProxyCollectorCountsTheCacheByPhase(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t)
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{ProxyNamespace: ns, MetricsAddr: "0", Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := registerProxyCollector(mgr, reg); err != nil {
		t.Fatal(err)
	}
	t.Run("registering twice is an error, not a panic", func(t *testing.T) {
		if err := registerProxyCollector(mgr, reg); err == nil || !strings.Contains(err.Error(), "Proxy phase gauge") {
			t.Fatalf("second registration: %v, want an error naming the gauge", err)
		}
	})
	t.Run("before the cache starts the scrape still succeeds, without the series", func(t *testing.T) {
		n, err := testutil.GatherAndCount(reg, "proxyfleet_proxies")
		if err != nil || n != 0 {
			t.Fatalf("%d series, error %v; want none and no error", n, err)
		}
	})

	ctx := context.Background()
	create := func(name string, phase v1alpha1.ProxyPhase) *v1alpha1.Proxy {
		t.Helper()
		p := gen.Proxy(name, gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.9", 3128))
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			p.Status.Phase = phase
			if err := env.Client.Status().Update(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	create("ready-1", v1alpha1.PhaseReady)
	create("ready-2", v1alpha1.PhaseReady)
	sick := create("sick", v1alpha1.PhaseUnhealthy)
	create("unwritten", "")

	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	expect := func(ready, unhealthy, pending int) string {
		return fmt.Sprintf(`
# HELP proxyfleet_proxies Proxy objects by status.phase, read from the controller's cache at scrape time.
# TYPE proxyfleet_proxies gauge
proxyfleet_proxies{phase="Deleting"} 0
proxyfleet_proxies{phase="Failed"} 0
proxyfleet_proxies{phase="Pending"} %d
proxyfleet_proxies{phase="Provisioning"} 0
proxyfleet_proxies{phase="Ready"} %d
proxyfleet_proxies{phase="Unhealthy"} %d
`, pending, ready, unhealthy)
	}
	t.Run("every phase is a series; a Proxy without a phase yet counts as Pending", func(t *testing.T) {
		poll.Until(t, 30*time.Second, "a series per phase", func() error {
			return testutil.GatherAndCompare(reg, strings.NewReader(expect(2, 1, 1)), "proxyfleet_proxies")
		})
	})
	t.Run("a phase change and a deletion show in the next scrape", func(t *testing.T) {
		sick.Status.Phase = v1alpha1.PhaseReady
		if err := env.Client.Status().Update(ctx, sick); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unwritten"}}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, "the phase change and the deletion in the scrape", func() error {
			return testutil.GatherAndCompare(reg, strings.NewReader(expect(3, 0, 0)), "proxyfleet_proxies")
		})
	})
}

// pricedProvider is a provider entry whose config gives a price.
type pricedProvider struct {
	providers.Provider
	price float64
}

func (p pricedProvider) HourlyPrice() float64 { return p.price }

// TestPriceCollectorReportsEveryManagedProxyWithAnInstance wires the price
// collector as the controller does, over a real manager cache: a Managed
// Proxy with an instance on a priced entry is reported at the entry's
// price (through the metrics decorator, as the run wraps providers); one
// without an instance yet, one on an entry without a price and an External
// one are not.
func TestPriceCollectorReportsEveryManagedProxyWithAnInstance(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t)
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{ProxyNamespace: ns, MetricsAddr: "0", Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	provs := map[string]providers.Provider{
		"aws-eu": providers.WithMetrics(pricedProvider{Provider: providertest.New(), price: 0.0104}, "aws-eu", metrics.NewProviderRequests(reg)),
		"pods":   providertest.New(),
	}
	if err := registerPriceCollector(mgr, reg, provs); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create := func(name, provider, providerID string) *v1alpha1.Proxy {
		t.Helper()
		p := gen.Proxy(name, gen.SetProxyNamespace(ns), gen.SetProxyManaged(provider))
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if providerID != "" {
			p.Status.ProviderID = providerID
			if err := env.Client.Status().Update(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	create("eu-1", "aws-eu", "aws:///eu-west-1a/i-0123456789abcdef0")
	create("eu-2", "aws-eu", "")
	create("pod-1", "pods", "egress/proxy-abc")
	if err := env.Client.Create(ctx, gen.Proxy("ext", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.9", 3128))); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	want := fmt.Sprintf(`
# HELP proxyfleet_proxy_hourly_price Configured hourly price of each Managed Proxy's instance (its provider entry's hourlyPrice), for cost accounting.
# TYPE proxyfleet_proxy_hourly_price gauge
proxyfleet_proxy_hourly_price{namespace=%q,provider="aws-eu",proxy="eu-1"} 0.0104
`, ns)
	poll.Until(t, 30*time.Second, "the priced Proxy's series", func() error {
		return testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_proxy_hourly_price")
	})
}
