package health

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
)

// TestOneTickProbesAWholeNewFleet starts the engine with a tick of an hour,
// so only the tick at start runs, and two workers: every one of 60 new
// Proxies behind a real Squid must still get its first verdict. A tick
// hands all due probes to the workers' queue; an engine that dispatched only
// as many probes per tick as it has workers would verdict two or three and
// leave the rest for ticks an hour apart (a thousand new Proxies took
// minutes to turn Ready at the default tick of a second).
func TestOneTickProbesAWholeNewFleet(t *testing.T) {
	sq := squid.Start(t, squid.Options{Name: "dispatch", OutgoingAddr: "127.0.0.229"})
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	const n = 60
	var items []v1alpha1.Proxy
	for i := range n {
		items = append(items, *gen.Proxy(fmt.Sprintf("px-%02d", i), gen.SetProxyNamespace("ns"),
			gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/probe", IntervalSeconds: 60, TimeoutSeconds: 5})))
	}
	e, err := New(Options{Reader: &listReader{items: items}, Tick: time.Hour, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	got := map[string]bool{}
	deadline := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case ev := <-e.Events():
			got[ev.Object.GetName()] = true
		case <-deadline:
			t.Fatalf("%d of %d Proxies got a verdict from the first tick", len(got), n)
		}
	}
	for _, p := range items {
		if v, _ := e.Snapshot(keyOf(&p)); !v.Known || !v.Healthy {
			t.Errorf("%s: verdict %+v, want healthy", p.Name, v)
		}
	}
	if c := target.Count(sq.OutgoingAddr()); c != n {
		t.Errorf("the target saw %d probes through the Squid, want %d (one each)", c, n)
	}
}
