package providers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

type countingRecorder struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *countingRecorder) ProviderRequest(provider, op, result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[provider+"/"+op+"/"+result]++
}

func TestWithMetricsCountsEveryOperation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		err    error
		result string
	}{
		{nil, "ok"},
		{fmt.Errorf("%w: x", providers.ErrTransient), "transient"},
		{fmt.Errorf("%w: x", providers.ErrPermanent), "permanent"},
		{fmt.Errorf("%w: x", providers.ErrQuotaExceeded), "quota_exceeded"},
		{fmt.Errorf("%w: x", providers.ErrNotFound), "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.result, func(t *testing.T) {
			inner := providertest.NewWith(providers.Instance{ProviderID: "id"})
			if tt.err != nil {
				for _, op := range []string{providers.OpCreate, providers.OpGet, providers.OpDelete, providers.OpList} {
					inner.FailAlways(op, tt.err)
				}
				inner.AnswerFailedCreate(func(req providers.CreateRequest, _ error) providers.Instance {
					return providers.Instance{Name: req.Name}
				})
			}
			rec := &countingRecorder{}
			p := providers.WithMetrics(inner, "in-cluster", rec)
			inst, err := p.Create(ctx, providers.CreateRequest{Name: "proxy-a"})
			if err != tt.err || inst.Name != "proxy-a" {
				t.Fatalf("Create returned %+v, %v: the decorator must pass results through", inst, err)
			}
			_, _ = p.Get(ctx, "id")
			_, _ = p.Get(ctx, "id")
			_ = p.Delete(ctx, "id")
			_, _ = p.ListByTag(ctx)
			want := map[string]int{
				"in-cluster/create/" + tt.result: 1,
				"in-cluster/get/" + tt.result:    2,
				"in-cluster/delete/" + tt.result: 1,
				"in-cluster/list/" + tt.result:   1,
			}
			if fmt.Sprint(rec.counts) != fmt.Sprint(want) {
				t.Fatalf("recorded %v, want %v", rec.counts, want)
			}
			if inner.Count(providers.OpGet) != 2 {
				t.Fatalf("inner saw %v", inner)
			}
			if p.(providers.Unwrapper).Unwrap() != providers.Provider(inner) {
				t.Fatal("Unwrap does not return the wrapped provider")
			}
		})
	}
}

func TestWithMetricsPreservesChecker(t *testing.T) {
	rec := &countingRecorder{}
	inner := providertest.NewChecker(providers.TargetStatus{Target: "apiserver", Ready: true, Reason: "OK"})
	p := providers.WithMetrics(inner, "pods", rec)
	c, ok := p.(providers.Checker)
	if !ok {
		t.Fatal("decorated Checker lost its Check method")
	}
	got := c.Check(context.Background())
	if len(got) != 1 || got[0].Target != "apiserver" || inner.Checks() != 1 {
		t.Fatalf("Check = %+v (inner checks %d)", got, inner.Checks())
	}
	if len(rec.counts) != 0 {
		t.Fatalf("a check was recorded as a provider request: %v", rec.counts)
	}
	if _, ok := providers.WithMetrics(providertest.New(), "x", rec).(providers.Checker); ok {
		t.Fatal("decorator claims Checker for a provider that has none")
	}
}

type pricedProvider struct {
	providers.Provider
	price float64
}

func (p pricedProvider) HourlyPrice() float64 { return p.price }

func TestHourlyPriceOfLooksThroughDecorators(t *testing.T) {
	priced := pricedProvider{Provider: providertest.New(), price: 0.0104}
	if got := providers.HourlyPriceOf(providers.WithTracing(providers.WithMetrics(priced, "aws-eu", &countingRecorder{}), "aws-eu")); got != 0.0104 {
		t.Fatalf("HourlyPriceOf(decorated) = %v, want 0.0104", got)
	}
	if got := providers.HourlyPriceOf(providers.WithMetrics(providertest.New(), "x", &countingRecorder{})); got != 0 {
		t.Fatalf("HourlyPriceOf(no Pricer) = %v, want 0", got)
	}
}
