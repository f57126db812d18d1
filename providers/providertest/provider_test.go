package providertest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

// The fake keeps the contract the reconciler is tested against; if it
// drifted, the controller's tests would pass against a backend that no
// real provider is.
func TestProviderKeepsTheContract(t *testing.T) {
	ctx := context.Background()
	f := New()
	req := providers.CreateRequest{Name: "px", OwnerUID: "uid-1"}
	a, err := f.Create(ctx, req)
	if err != nil || a.State != providers.StateRunning || a.IP == "" || a.ProviderID != ProviderID("px") {
		t.Fatalf("Create = %+v, %v", a, err)
	}
	if b, err := f.Create(ctx, req); err != nil || b.ProviderID != a.ProviderID || b.IP != a.IP {
		t.Fatalf("a second Create of the same name = %+v, %v, want the same instance", b, err)
	}
	if _, err := f.Create(ctx, providers.CreateRequest{Name: "px", OwnerUID: "uid-2"}); providers.Class(err) != providers.ErrPermanent {
		t.Fatalf("Create of a name another owner holds = %v, want permanent", err)
	}
	if err := f.Delete(ctx, a.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Create(ctx, req); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("Create while the name's instance goes away = %v, want transient", err)
	}
	for i := range 2 {
		if got, err := f.Get(ctx, a.ProviderID); err != nil || got.State != providers.StateTerminated {
			t.Fatalf("Get %d after Delete = %+v, %v, want Terminated", i+1, got, err)
		}
	}
	if _, err := f.Get(ctx, a.ProviderID); providers.Class(err) != providers.ErrNotFound {
		t.Fatalf("third Get after Delete = %v, want not found", err)
	}
	if err := f.Delete(ctx, a.ProviderID); err != nil {
		t.Fatalf("Delete of a gone instance = %v, want nil", err)
	}
	if got := f.Deleted(); !slices.Equal(got, []string{a.ProviderID, a.ProviderID}) {
		t.Fatalf("Deleted = %v", got)
	}
}

func TestProviderFailsOnCue(t *testing.T) {
	ctx := context.Background()
	f := NewWith(providers.Instance{ProviderID: "a"}, providers.Instance{ProviderID: "b"})
	boom := ErrClass(providers.ErrTransient, "boom")
	f.FailNext(providers.OpList, 1, boom)
	if _, err := f.ListByTag(ctx); !errors.Is(err, boom) {
		t.Fatalf("first List = %v, want the injected error", err)
	}
	if got, err := f.ListByTag(ctx); err != nil || len(got) != 2 || got[0].ProviderID != "a" {
		t.Fatalf("second List = %+v, %v, want both instances in order", got, err)
	}
	f.FailDeleteOf("a", boom)
	if err := f.Delete(ctx, "a"); !errors.Is(err, boom) {
		t.Fatalf("Delete of a = %v, want the injected error", err)
	}
	if err := f.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got := f.Deleted(); !slices.Equal(got, []string{"b"}) || f.Count(providers.OpDelete) != 2 {
		t.Fatalf("Deleted = %v with %d Deletes, want [b] of 2", got, f.Count(providers.OpDelete))
	}
	f.ClearFailures()
	if err := f.Delete(ctx, "a"); err != nil {
		t.Fatalf("Delete after ClearFailures = %v", err)
	}
}

func TestCheckerHoldsAndAnswers(t *testing.T) {
	c := NewChecker(providers.TargetStatus{Target: "api", Ready: true})
	release := make(chan struct{})
	c.Block(release, func(err error) []providers.TargetStatus {
		return []providers.TargetStatus{{Target: "api", Reason: "Timeout", Message: err.Error()}}
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := c.Check(ctx); len(got) != 1 || got[0].Reason != "Timeout" {
		t.Fatalf("held Check with a cancelled context = %+v, want onCancel's answer", got)
	}
	close(release)
	if got := c.Check(context.Background()); len(got) != 1 || !got[0].Ready || c.Checks() != 2 {
		t.Fatalf("released Check = %+v after %d checks", got, c.Checks())
	}
}
