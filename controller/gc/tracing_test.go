package gc

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

func TestSweepIsOneSpanWithTheProviderCallsUnderIt(t *testing.T) {
	sr, _ := spanrec.Record(t)
	a := providertest.NewWith(inst("a/orphan", "uid-gone", time.Hour))
	s, err := New(Options{
		Reader:       &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers:    map[string]providers.Provider{"alpha": providers.WithTracing(a, "alpha")},
		Installation: testInstallation,
		Clock:        clocktesting.NewFakeClock(t0),
		Logger:       (&testutil.LogLines{}).Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.sweep(context.Background())

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range sr.Ended() {
		byName[sp.Name()] = append(byName[sp.Name()], sp)
	}
	if len(byName["gc.sweep"]) != 1 {
		t.Fatalf("spans %v, want one gc.sweep", byName)
	}
	sweep := byName["gc.sweep"][0].SpanContext().SpanID()
	for _, name := range []string{providers.SpanList, providers.SpanDelete} {
		if len(byName[name]) != 1 || byName[name][0].Parent().SpanID() != sweep {
			t.Errorf("want one %s under gc.sweep, got %v", name, byName[name])
		}
	}
}
