package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// leaseAPIRun is a run of only the lease API s, named as the controller
// command names it, registering with reg.
func leaseAPIRun(s LeaseAPI, reg prometheus.Registerer) *run {
	return newRun(&Config{LeaseAPI: s, Names: Names{LeaseAPIListen: "--lease-api-listen"}}, logr.Discard(), reg)
}

func TestTheLeaseRequestTimelineExistsWithTheStatusPageOff(t *testing.T) {
	if r := newRun(&Config{}, logr.Discard(), prometheus.NewRegistry()); r.requests == nil {
		t.Fatal("no timeline without a status page: the lease API's recorder has nothing to feed")
	}
}

func TestSetupLeaseAPIServesAndExportsItsMetrics(t *testing.T) {
	env := testenv.Start(t)
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{ProxyNamespace: env.Namespace(t), MetricsAddr: "0", Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api, err := leaseAPIRun(LeaseAPI{Listen: "127.0.0.1:0", Token: "tok"}, reg).setupLeaseAPI(mgr)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a busy port names the flag", func(t *testing.T) {
		_, err := leaseAPIRun(LeaseAPI{Listen: api.Addr().String()}, prometheus.NewRegistry()).setupLeaseAPI(mgr)
		if err == nil || !strings.Contains(err.Error(), "--lease-api-listen "+api.Addr().String()) {
			t.Fatalf("error = %v, want one naming --lease-api-listen", err)
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	c, err := leaseapi.NewClient("http://"+api.Addr().String(), "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the lease API to answer an acquire on the empty pool", func() error {
		_, err := c.Acquire(context.Background(), pool.AcquireRequest{})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) {
			return fmt.Errorf("acquire on an empty pool = %v, want a 409", err)
		}
		return nil
	})
	if n := testutil.CollectAndCount(reg, "proxyfleet_lease_requests_total"); n != 1 {
		t.Fatalf("%d proxyfleet_lease_requests_total series, want the no_match one", n)
	}
	want := `
# HELP proxyfleet_leases_active Unexpired leases in the pool.
# TYPE proxyfleet_leases_active gauge
proxyfleet_leases_active 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_leases_active"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + api.Addr().String() + "/v1/proxies")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/proxies without the token = %d, want 401", resp.StatusCode)
	}
}
