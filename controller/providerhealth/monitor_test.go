package providerhealth

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

func TestCheckRunsEveryProviderConcurrently(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	a, b := providertest.NewChecker(up("a")), providertest.NewChecker(down("b", "Unreachable"))
	for _, c := range []*providertest.Checker{a, b} {
		c.Block(release, nil)
		c.Started(started)
	}
	m := newMonitor(t, Options{Client: env.Client, Checkers: map[string]providers.Checker{"pa": a, "pb": b}, Interval: time.Minute, Timeout: 20 * time.Second})

	got := make(chan []Result, 1)
	go func() { got <- m.check(context.Background()) }()
	// Both checks must be running at once: each blocks until released, so a
	// sequential round would never start the second.
	for i := range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of 2 checks started while the first was still running", i)
		}
	}
	close(release)
	res := <-got
	if len(res) != 2 || res[0].Provider != "pa" || !res[0].Ready() || res[1].Provider != "pb" || res[1].Ready() {
		t.Fatalf("results %+v", res)
	}
}

func TestACheckThatHonoursTheTimeoutReportsItsOwnVerdict(t *testing.T) {
	c := providertest.NewChecker()
	c.Block(make(chan struct{}), func(err error) []providers.TargetStatus {
		return []providers.TargetStatus{{Target: "api", Reason: ReasonTimeout, Message: err.Error()}}
	})
	m := newMonitor(t, Options{Client: env.Client, Checkers: map[string]providers.Checker{"p": c}, Interval: time.Minute, Timeout: 100 * time.Millisecond})
	start := time.Now()
	res := m.check(context.Background())
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the round took %s under a 100ms timeout", took)
	}
	if len(res) != 1 || len(res[0].Targets) != 1 || res[0].Targets[0].Target != "api" || res[0].Targets[0].Reason != ReasonTimeout {
		t.Fatalf("results %+v, want the checker's own Timeout verdict for target api", res)
	}
}

func TestAStuckCheckIsAbandonedAndNotStartedAgainUntilItReturns(t *testing.T) {
	release := make(chan struct{})
	c := providertest.NewChecker(up("host-1"))
	m := newMonitor(t, Options{Client: env.Client, Checkers: map[string]providers.Checker{"kvm-home": c}, Types: map[string]string{"kvm-home": "kvm"},
		Interval: time.Minute, Timeout: 100 * time.Millisecond, Logger: (&testutil.LogLines{}).Logger()})
	m.record(m.check(context.Background())) // a good round first: the target is known

	c.Block(release, nil) // from now on Check ignores ctx and hangs
	res := m.check(context.Background())
	if len(res) != 1 || res[0].Ready() || res[0].Targets[0].Target != "host-1" || res[0].Targets[0].Reason != ReasonTimeout {
		t.Fatalf("stuck round %+v, want host-1 not ready with reason Timeout", res)
	}
	res = m.check(context.Background())
	if c.Checks() != 2 {
		t.Fatalf("Check called %d times, want 2: a stuck check must not be started again", c.Checks())
	}
	if res[0].Targets[0].Reason != ReasonTimeout || res[0].Type != "kvm" {
		t.Fatalf("round during the stuck check %+v, want Timeout at once", res)
	}

	close(release)
	poll.Until(t, 10*time.Second, "the stuck check to finish", func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		return poll.Check(!m.running["kvm-home"], "kvm-home still running")
	})
	c.Block(nil, nil)
	if res := m.check(context.Background()); !res[0].Ready() || c.Checks() != 3 {
		t.Fatalf("after the stuck check returned: %+v with %d calls, want a fresh ready check", res, c.Checks())
	}
}

func TestAProviderThatNeverReportedTimesOutUnderOneTarget(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := providertest.NewChecker()
	c.Block(release, nil)
	m := newMonitor(t, Options{Client: env.Client, Checkers: map[string]providers.Checker{"p": c}, Interval: time.Minute, Timeout: 50 * time.Millisecond})
	res := m.check(context.Background())
	if len(res[0].Targets) != 1 || res[0].Targets[0].Target != fallbackTarget || res[0].Targets[0].Reason != ReasonTimeout {
		t.Fatalf("result %+v, want one %q target timed out", res, fallbackTarget)
	}
}

func TestAStuckCheckIsAbandonedOnTheMonitorsClock(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	clk := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	c := providertest.NewChecker()
	c.Block(release, nil) // ignores ctx: only the abandon timer ends the round
	m := newMonitor(t, Options{Client: env.Client, Checkers: map[string]providers.Checker{"p": c},
		Interval: time.Hour, Timeout: 30 * time.Second, Clock: clk})
	got := make(chan []Result, 1)
	go func() { got <- m.check(context.Background()) }()
	poll.Until(t, 10*time.Second, "the abandon timer to be armed", func() error { return poll.Check(clk.HasWaiters(), "no waiter on the clock") })
	clk.Step(30 * time.Second) // the timeout alone: the grace is still running
	select {
	case res := <-got:
		t.Fatalf("the round ended before timeout and grace had passed on its clock: %+v", res)
	default:
	}
	clk.Step(abandonGrace)
	select {
	case res := <-got:
		if len(res) != 1 || res[0].Targets[0].Reason != ReasonTimeout || !res[0].CheckedAt.Equal(clk.Now()) {
			t.Fatalf("result %+v, want a Timeout verdict stamped with the fake clock's %v", res, clk.Now())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stepping the clock past timeout and grace did not abandon the stuck check")
	}
}

func TestNewNamesTheBadOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no client", Options{}, "Options.Client"},
		{"a negative interval", Options{Client: env.Client, Interval: -time.Second}, "Options.Interval"},
		{"a negative timeout", Options{Client: env.Client, Timeout: -time.Second}, "Options.Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestMonitorRunsOnTheLeaderOnly checks what the manager consults to start a
// runnable only once elected: one replica checks and writes ProviderHealth.
func TestMonitorRunsOnTheLeaderOnly(t *testing.T) {
	var r manager.Runnable = &Monitor{}
	le, ok := r.(manager.LeaderElectionRunnable)
	if !ok || !le.NeedLeaderElection() {
		t.Fatal("the provider health monitor must need leader election")
	}
}
