package gc

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func proxyWithUID(uid string) v1alpha1.Proxy {
	return v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "px-" + uid, Namespace: "crawl", UID: types.UID(uid)}}
}

func inst(id, uid string, age time.Duration) providers.Instance {
	return providers.Instance{ProviderID: id, Name: id, OwnerUID: uid, Installation: testInstallation, CreatedAt: t0.Add(-age), State: providers.StateRunning}
}

// foreignInst is inst made by another installation sharing the backend.
func foreignInst(id, uid string, age time.Duration) providers.Instance {
	i := inst(id, uid, age)
	i.Installation = "another-cluster"
	return i
}

func TestSweepDeletesOnlyProvableOrphans(t *testing.T) {
	logs := &testutil.LogLines{}
	a := providertest.NewWith(
		inst("a/orphan", "uid-gone", time.Hour),
		inst("a/live", "uid-live", time.Hour),
		inst("a/untagged", "", time.Hour),
		inst("a/young", "uid-gone-too", time.Minute),
		foreignInst("a/foreign", "uid-gone-elsewhere", time.Hour),
	)
	b := providertest.NewWith(inst("b/orphan", "uid-gone-b", 11*time.Minute))
	s := newSweeper(t, Options{
		Reader:    &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers: map[string]providers.Provider{"alpha": a, "beta": b},
		Clock:     clocktesting.NewFakeClock(t0),
		Logger:    logs.Logger(),
	})
	res := s.sweep(context.Background())

	if got := a.Deleted(); !reflect.DeepEqual(got, []string{"a/orphan"}) {
		t.Errorf("alpha deleted %v, want only a/orphan", got)
	}
	if got := b.Deleted(); !reflect.DeepEqual(got, []string{"b/orphan"}) {
		t.Errorf("beta deleted %v, want only b/orphan", got)
	}
	wantKept := map[decision]int{keepLive: 1, keepUntagged: 1, keepYoung: 1, keepForeign: 1}
	if res.skipped || res.errors != 0 || !reflect.DeepEqual(res.kept, wantKept) {
		t.Errorf("result %+v, want kept %v and no errors", res, wantKept)
	}
	for _, want := range [][]string{
		{"WARNING:", `"provider"="alpha"`, `"providerID"="a/orphan"`, `"uid"="uid-gone"`},
		{"WARNING:", `"provider"="beta"`, `"providerID"="b/orphan"`, `"uid"="uid-gone-b"`},
	} {
		if len(logs.Matching(want...)) != 1 {
			t.Errorf("no single kill line with %v in:\n%s", want, logs.String())
		}
	}
}

func TestSweepSkipsEverythingWhenTheProxyListFails(t *testing.T) {
	logs := &testutil.LogLines{}
	p := providertest.NewWith(inst("orphan", "uid-gone", time.Hour))
	s := newSweeper(t, Options{
		Reader:    &proxyReader{err: errors.New("apiserver unavailable")},
		Providers: map[string]providers.Provider{"alpha": p},
		Clock:     clocktesting.NewFakeClock(t0),
		Logger:    logs.Logger(),
	})
	res := s.sweep(context.Background())
	if !res.skipped {
		t.Errorf("sweep was not reported skipped: %+v", res)
	}
	if p.Count(providers.OpList) != 0 || len(p.Deleted()) != 0 {
		t.Errorf("a skipped sweep still listed %d times and deleted %v", p.Count(providers.OpList), p.Deleted())
	}
	if len(logs.Matching("skipping this sweep", "apiserver unavailable")) != 1 {
		t.Errorf("the skipped sweep was not logged with its cause:\n%s", logs.String())
	}
}

func TestSweepContinuesPastAFailingProvider(t *testing.T) {
	logs := &testutil.LogLines{}
	broken := providertest.New()
	broken.FailAlways(providers.OpList, errors.New("backend down"))
	undeletable := providertest.NewWith(inst("c/stuck", "uid-1", time.Hour), inst("c/orphan", "uid-2", time.Hour))
	undeletable.FailDeleteOf("c/stuck", errors.New("permission denied"))
	s := newSweeper(t, Options{
		Reader:    &proxyReader{},
		Providers: map[string]providers.Provider{"a-broken": broken, "c-undeletable": undeletable},
		Clock:     clocktesting.NewFakeClock(t0),
		Logger:    logs.Logger(),
	})
	res := s.sweep(context.Background())
	if got := undeletable.Deleted(); !reflect.DeepEqual(got, []string{"c/orphan"}) {
		t.Errorf("deleted %v, want c/orphan despite the failures before it", got)
	}
	if res.errors != 2 {
		t.Errorf("errors = %d, want 2 (one list, one delete)", res.errors)
	}
	if len(logs.Matching("listing the provider's instances failed", `"provider"="a-broken"`)) != 1 {
		t.Errorf("the failing provider was not logged:\n%s", logs.String())
	}
}

func TestNewRefusesANamespacedViewUnlessAllowed(t *testing.T) {
	tests := []struct {
		name    string
		ns      string
		allow   bool
		wantErr bool
	}{
		{"a cluster-wide view runs", "", false, false},
		{"a namespaced view without the opt-in is refused", "crawl", false, true},
		{"a namespaced view with the opt-in runs", "crawl", true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testutil.LogLines{}
			s, err := New(Options{
				Reader: &proxyReader{}, Namespace: tc.ns, AllowNamespaced: tc.allow, Installation: testInstallation,
				Clock: clocktesting.NewFakeClock(t0), Logger: logs.Logger(),
			})
			if tc.wantErr {
				if !errors.Is(err, ErrNamespaced) {
					t.Fatalf("New = %v, want ErrNamespaced", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New = %v", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Start(ctx) }()
			poll.Until(t, 10*time.Second, "the sweeper to start", func() error {
				return poll.Check(len(logs.Matching("orphan GC started")) == 1, "logs:\n%s", logs.String())
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Start returned %v after cancel, want nil", err)
			}
		})
	}
}

func TestNewNamesTheBadOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no reader", Options{}, "Options.Reader"},
		{"no installation", Options{Reader: &proxyReader{}}, "Options.Installation"},
		{"a negative interval", Options{Reader: &proxyReader{}, Installation: testInstallation, Interval: -time.Second}, "Options.Interval"},
		{"a negative minimum age", Options{Reader: &proxyReader{}, Installation: testInstallation, MinAge: -time.Second}, "Options.MinAge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestStartSweepsOnlyAfterAFullInterval(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	reader := &proxyReader{}
	p := providertest.NewWith(inst("orphan", "uid-gone", time.Hour))
	s := newSweeper(t, Options{
		Reader: reader, Providers: map[string]providers.Provider{"alpha": p},
		Interval: 10 * time.Minute, MinAge: 10 * time.Minute, Clock: clk, Logger: (&testutil.LogLines{}).Logger(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	poll.Until(t, 10*time.Second, "the ticker to be armed", func() error { return poll.Check(clk.HasWaiters(), "no waiter on the clock") })

	clk.Step(10*time.Minute - time.Second)
	time.Sleep(100 * time.Millisecond) // a sweep now would be a bug; give it a chance to show
	if reader.listCalls() != 0 {
		t.Fatalf("swept %d times before a full interval passed", reader.listCalls())
	}
	clk.Step(time.Second)
	poll.Until(t, 10*time.Second, "the first sweep", func() error {
		return poll.Check(len(p.Deleted()) == 1, "deleted %v", p.Deleted())
	})
	clk.Step(10 * time.Minute)
	// Wait for the second sweep's Delete, not only its List: cancelling
	// between the two stops the sweep before it deletes.
	poll.Until(t, 10*time.Second, "the second sweep", func() error {
		return poll.Check(reader.listCalls() == 2 && len(p.Deleted()) == 2, "%d lists, deleted %v", reader.listCalls(), p.Deleted())
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Start returned %v", err)
	}
	// The double never forgets an instance, so each sweep deletes it again.
	if ids := p.Deleted(); len(ids) != 2 {
		t.Fatalf("deleted %v over two sweeps, want the orphan once per sweep", ids)
	}
}

// TestSweeperRunsOnTheLeaderOnly checks what the manager consults to start a
// runnable only once elected: deleting is destructive, so exactly one
// replica may sweep.
func TestSweeperRunsOnTheLeaderOnly(t *testing.T) {
	var r manager.Runnable = &Sweeper{}
	le, ok := r.(manager.LeaderElectionRunnable)
	if !ok || !le.NeedLeaderElection() {
		t.Fatal("the orphan GC must need leader election")
	}
}
