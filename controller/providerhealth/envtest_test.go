package providerhealth

// The Monitor against a real kube-apiserver and etcd (envtest): real
// ProviderHealth objects (cluster-scoped, status subresource, the generated
// CRD's validation), and the real kubernetes provider's Checker. A scripted
// Checker stands in for a backend that fails and recovers on cue.
//
// ProviderHealth objects are cluster-scoped and the Monitor deletes the ones
// it does not check at start, so these tests do not run in parallel.

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const wait = 30 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// run starts m and stops it when the test ends (or when the returned stop
// is called), failing the test if Start returns an error.
func run(t *testing.T, m *Monitor) (stop func()) {
	t.Helper()
	return testutil.RunUntilCleanup(t, "Monitor.Start", wait, m.Start)
}

func getPH(t *testing.T, name string) (*v1alpha1.ProviderHealth, bool) {
	t.Helper()
	var ph v1alpha1.ProviderHealth
	err := env.Client.Get(testCtx(t), client.ObjectKey{Name: name}, &ph)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("get ProviderHealth %s: %v", name, err)
	}
	return &ph, true
}

// waitPH polls the object until cond holds.
func waitPH(t *testing.T, name, what string, cond func(*v1alpha1.ProviderHealth) bool) *v1alpha1.ProviderHealth {
	t.Helper()
	var last *v1alpha1.ProviderHealth
	poll.Until(t, wait, "ProviderHealth "+name+": "+what, func() error {
		ph, ok := getPH(t, name)
		if !ok {
			return fmt.Errorf("no ProviderHealth %s; last seen: %+v", name, last)
		}
		last = ph
		return poll.Check(cond(ph), "last seen: %+v", ph)
	})
	return last
}

func readyCond(ph *v1alpha1.ProviderHealth) *metav1.Condition {
	return meta.FindStatusCondition(ph.Status.Conditions, v1alpha1.ConditionReady)
}

func TestTheKubernetesProviderTurnsReady(t *testing.T) {
	ns := env.Namespace(t)
	prov, err := kubeprovider.New(env.Client, kubeprovider.Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	rec := &countingRecorder{}
	wrapped := map[string]providers.Provider{"in-cluster": providers.WithMetrics(prov, "in-cluster", rec)}
	logs := &testutil.LogLines{}
	m := newMonitor(t, Options{
		Checkers: CheckersFrom(wrapped), Types: map[string]string{"in-cluster": "kubernetes"},
		Client: env.Client, APIReader: env.Client, Interval: 300 * time.Millisecond, Logger: logs.Logger(),
	})
	run(t, m)

	ph := waitPH(t, "in-cluster", "Ready", func(ph *v1alpha1.ProviderHealth) bool { return ph.Status.Ready })
	if ph.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		t.Errorf("labels %v lack the managed-by label", ph.Labels)
	}
	st := ph.Status
	if st.Type != "kubernetes" || st.TargetsReady != "1/1" || len(st.Targets) != 1 || st.LastCheckTime == nil {
		t.Fatalf("status %+v", st)
	}
	if tg := st.Targets[0]; tg.Name != "apiserver" || !tg.Ready || tg.Reason != "OK" || tg.Details["namespace"] != ns || tg.LastTransitionTime.IsZero() {
		t.Errorf("target %+v", tg)
	}
	if c := readyCond(ph); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAllTargetsReady {
		t.Errorf("Ready condition %+v", c)
	}
	if len(logs.Matching("provider target ready", `"provider"="in-cluster"`, `"target"="apiserver"`)) != 1 {
		t.Errorf("the first ready verdict was not logged once:\n%s", logs.String())
	}
	// The check ran several times by now; none counted as a provider request.
	waitPH(t, "in-cluster", "a later round", func(p *v1alpha1.ProviderHealth) bool {
		return p.Status.LastCheckTime.After(st.LastCheckTime.Time)
	})
	if n := rec.n.Load(); n != 0 {
		t.Errorf("checks were recorded as %d provider requests", n)
	}
}

func TestAFailingProviderTurnsNotReadyAndBack(t *testing.T) {
	c := providertest.NewChecker()
	c.Set(up("host-a"), down("host-b", "Unreachable"))
	logs := &testutil.LogLines{}
	m := newMonitor(t, Options{
		Checkers: map[string]providers.Checker{"kvm-flaky": c}, Types: map[string]string{"kvm-flaky": "kvm"},
		Client: env.Client, APIReader: env.Client, Interval: 200 * time.Millisecond, Logger: logs.Logger(),
	})
	run(t, m)

	ph := waitPH(t, "kvm-flaky", "the first round", func(ph *v1alpha1.ProviderHealth) bool { return ph.Status.LastCheckTime != nil })
	if ph.Status.Ready || ph.Status.TargetsReady != "1/2" {
		t.Fatalf("status %+v, want not ready with 1/2", ph.Status)
	}
	cond := readyCond(ph)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "Unreachable" {
		t.Fatalf("Ready condition %+v, want False/Unreachable", cond)
	}
	downSince := ph.Status.Targets[1].LastTransitionTime

	// Steady rounds log nothing more.
	n := c.Checks()
	poll.Until(t, wait, "three more rounds", func() error {
		return poll.Check(c.Checks() >= n+3, "%d rounds, %d before", c.Checks(), n)
	})
	if lines := logs.Matching("WARNING: provider target not ready", `"target"="host-b"`, `"reason"="Unreachable"`); len(lines) != 1 {
		t.Errorf("want exactly one WARNING for host-b over steady rounds, got %d:\n%s", len(lines), logs.String())
	}

	// A different reason while still down is logged again.
	c.Set(up("host-a"), down("host-b", "AuthFailed"))
	waitPH(t, "kvm-flaky", "the new reason", func(ph *v1alpha1.ProviderHealth) bool {
		c := readyCond(ph)
		return c != nil && c.Reason == "AuthFailed"
	})
	if len(logs.Matching("WARNING: provider target not ready", `"reason"="AuthFailed"`)) != 1 {
		t.Errorf("the changed reason was not logged:\n%s", logs.String())
	}

	// Back up: Ready, and host-b's transition time moves.
	time.Sleep(1100 * time.Millisecond) // API timestamps have one-second resolution
	c.Set(up("host-a"), up("host-b"))
	ph = waitPH(t, "kvm-flaky", "Ready again", func(ph *v1alpha1.ProviderHealth) bool { return ph.Status.Ready })
	if cond := readyCond(ph); cond.Status != metav1.ConditionTrue || ph.Status.TargetsReady != "2/2" {
		t.Errorf("status %+v", ph.Status)
	}
	if !ph.Status.Targets[1].LastTransitionTime.After(downSince.Time) {
		t.Errorf("host-b lastTransitionTime %v did not move past %v when it came back", ph.Status.Targets[1].LastTransitionTime, downSince)
	}
	poll.Until(t, wait, "the recovery log line", func() error {
		return poll.Check(len(logs.Matching("provider target ready", `"target"="host-b"`)) == 1, "logs:\n%s", logs.String())
	})
}

func TestLastTransitionTimeSurvivesSteadyRounds(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	c := providertest.NewChecker()
	c.Set(up("api"))
	m := newMonitor(t, Options{
		Checkers: map[string]providers.Checker{"steady": c}, Types: map[string]string{"steady": "gcp"},
		Client: env.Client, APIReader: env.Client, Interval: time.Minute, Clock: clk, Logger: (&testutil.LogLines{}).Logger(),
	})
	run(t, m)
	first := waitPH(t, "steady", "the first round", func(ph *v1alpha1.ProviderHealth) bool { return ph.Status.Ready })
	since := first.Status.Targets[0].LastTransitionTime
	condSince := readyCond(first).LastTransitionTime

	last := first.Status.LastCheckTime.Time
	for i := range 3 {
		poll.Until(t, wait, "the ticker to be armed", func() error { return poll.Check(clk.HasWaiters(), "no waiter on the clock") })
		clk.Step(time.Minute)
		ph := waitPH(t, "steady", "the next round", func(ph *v1alpha1.ProviderHealth) bool {
			return ph.Status.LastCheckTime.After(last)
		})
		last = ph.Status.LastCheckTime.Time
		if got := ph.Status.Targets[0].LastTransitionTime; !got.Equal(&since) {
			t.Fatalf("round %d: target lastTransitionTime moved from %v to %v without a flip", i+2, since, got)
		}
		if got := readyCond(ph).LastTransitionTime; !got.Equal(&condSince) {
			t.Fatalf("round %d: Ready condition lastTransitionTime moved from %v to %v", i+2, condSince, got)
		}
	}
	if want := since.Add(3 * time.Minute); !last.Equal(want) {
		t.Errorf("lastCheckTime %v, want %v after three one-minute steps", last, want)
	}
}

func createPH(t *testing.T, name string, managed bool) {
	t.Helper()
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if managed {
		ph.Labels = map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}
	}
	if err := env.Client.Create(testCtx(t), ph); err != nil {
		t.Fatalf("create ProviderHealth %s: %v", name, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ph) })
}

func TestStaleObjectsAreDeletedAtStart(t *testing.T) {
	tests := []struct {
		name     string
		interval time.Duration
		// keep and gone name the managed objects that survive Start and the
		// ones it deletes; "not-ours" (unlabelled) always survives.
		keep, gone []string
	}{
		{"objects of providers no longer configured go", time.Hour, []string{"still-here"}, []string{"removed-entry"}},
		{"with checks off every managed object goes", 0, nil, []string{"still-here", "removed-entry"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			createPH(t, "still-here", true)
			createPH(t, "removed-entry", true)
			createPH(t, "not-ours", false)
			c := providertest.NewChecker()
			c.Set(up("api"))
			logs := &testutil.LogLines{}
			m := newMonitor(t, Options{
				Checkers: map[string]providers.Checker{"still-here": c}, Client: env.Client, APIReader: env.Client,
				Interval: tc.interval, Logger: logs.Logger(),
			})
			stop := run(t, m)
			if tc.interval > 0 {
				waitPH(t, "still-here", "its first round", func(ph *v1alpha1.ProviderHealth) bool { return ph.Status.Ready })
			} else {
				poll.Until(t, wait, "Start to finish with checks off", func() error {
					return poll.Check(len(logs.Matching("provider health checks are off")) == 1, "logs:\n%s", logs.String())
				})
			}
			stop()
			for _, name := range append(tc.keep, "not-ours") {
				if _, ok := getPH(t, name); !ok {
					t.Errorf("%s was deleted", name)
				}
			}
			for _, name := range tc.gone {
				if _, ok := getPH(t, name); ok {
					t.Errorf("stale %s was not deleted; log:\n%s", name, logs.String())
				}
			}
			if tc.interval == 0 && c.Checks() != 0 {
				t.Errorf("checks are off but Check ran %d times", c.Checks())
			}
		})
	}
}

func TestAnInvalidProviderNameGetsMetricsButNoObject(t *testing.T) {
	c := providertest.NewChecker()
	c.Set(up("api"))
	logs := &testutil.LogLines{}
	m := newMonitor(t, Options{
		Checkers: map[string]providers.Checker{"Not_A_Name": c}, Client: env.Client, APIReader: env.Client,
		Interval: 200 * time.Millisecond, Logger: logs.Logger(),
	})
	run(t, m)
	poll.Until(t, wait, "two rounds", func() error { return poll.Check(c.Checks() >= 2, "%d rounds", c.Checks()) })
	if len(logs.Matching("WARNING: provider name is not a valid object name", `"provider"="Not_A_Name"`)) != 1 {
		t.Errorf("no warning at start:\n%s", logs.String())
	}
	var seen []string
	m.EachTarget(func(provider, target string, up bool, _ time.Duration, _ time.Time) {
		if up {
			seen = append(seen, provider+"/"+target)
		}
	})
	if len(seen) != 1 || seen[0] != "Not_A_Name/api" {
		t.Errorf("EachTarget saw %v, want Not_A_Name/api up", seen)
	}
	if errs := logs.Matching("writing ProviderHealth failed"); len(errs) != 0 {
		t.Errorf("the monitor tried to write an object for an invalid name: %v", errs)
	}
}
