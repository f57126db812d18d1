package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

func TestDecideHeal(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const after = 5 * time.Minute
	healthy := func(name string, created time.Duration) healMember {
		return healMember{Name: name, Created: now.Add(-created), Ready: true}
	}
	sick := func(name string, for_ time.Duration) healMember {
		return healMember{Name: name, Created: now.Add(-time.Hour), UnhealthySince: now.Add(-for_), Why: "probe failed"}
	}
	tests := []struct {
		name        string
		in          healInput
		wantReplace []string
		wantReason  string
		wantFailed  int
		wantWake    time.Duration // from now; 0: none
	}{
		{"off: nothing is decided", healInput{After: 0, Members: []healMember{sick("a", time.Hour)}}, nil, "", 0, 0},
		{"all healthy", healInput{After: after, Members: []healMember{healthy("a", time.Hour)}}, nil, v1alpha1.ReasonNoneUnhealthy, 0, 0},
		{"unhealthy for less than after waits, and wakes when due", healInput{After: after, Members: []healMember{healthy("a", time.Hour), sick("b", time.Minute)}},
			nil, v1alpha1.ReasonWaitingToReplace, 0, 4 * time.Minute},
		{"unhealthy for after is replaced; a first round is not a failed one", healInput{After: after, Members: []healMember{healthy("a", time.Hour), sick("b", after)}},
			[]string{"b"}, v1alpha1.ReasonReplacingUnhealthy, 0, 0},
		{"a Ready Proxy made since the last round resets the count", healInput{After: after, FailedRounds: 3, LastReplacement: now.Add(-10 * time.Minute),
			Members: []healMember{healthy("new", 9*time.Minute), sick("b", after)}}, []string{"b"}, v1alpha1.ReasonReplacingUnhealthy, 0, 0},
		{"no Ready Proxy since the last round: the next waits twice after", healInput{After: after, LastReplacement: now.Add(-6 * time.Minute),
			Members: []healMember{healthy("old", time.Hour), sick("b", after)}}, nil, v1alpha1.ReasonReplacementBackoff, 0, 4 * time.Minute},
		{"past the doubled wait the round goes and counts as failed", healInput{After: after, LastReplacement: now.Add(-10 * time.Minute),
			Members: []healMember{sick("b", after)}}, []string{"b"}, v1alpha1.ReasonReplacingUnhealthy, 1, 0},
		{"the wait doubles per failed round", healInput{After: after, FailedRounds: 2, LastReplacement: now.Add(-30 * time.Minute),
			Members: []healMember{sick("b", 20*time.Minute)}}, nil, v1alpha1.ReasonReplacementBackoff, 2, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Now = now
			d := decideHeal(tt.in)
			if !slices.Equal(d.Replace, tt.wantReplace) || d.Reason != tt.wantReason || d.FailedRounds != tt.wantFailed {
				t.Fatalf("decideHeal = replace %v reason %q failed %d (%s), want %v %q %d", d.Replace, d.Reason, d.FailedRounds, d.Message, tt.wantReplace, tt.wantReason, tt.wantFailed)
			}
			var wake time.Duration
			if !d.Wake.IsZero() {
				wake = d.Wake.Sub(now)
			}
			if wake != tt.wantWake {
				t.Fatalf("wake in %s, want %s", wake, tt.wantWake)
			}
		})
	}
}

func TestHealBackoffDoublesUpToItsCap(t *testing.T) {
	for _, tt := range []struct {
		after  time.Duration
		failed int
		want   time.Duration
	}{
		{5 * time.Minute, 0, 5 * time.Minute},
		{5 * time.Minute, 1, 10 * time.Minute},
		{5 * time.Minute, 3, 40 * time.Minute},
		{5 * time.Minute, 4, time.Hour},
		{5 * time.Minute, 60, time.Hour},
		{2 * time.Hour, 5, 2 * time.Hour},
	} {
		if got := healBackoff(tt.after, tt.failed); got != tt.want {
			t.Errorf("healBackoff(%s, %d) = %s, want %s", tt.after, tt.failed, got, tt.want)
		}
	}
}

func TestProxyPoolReplacesAProxyUnhealthyPastReplaceUnhealthyAfterWithinMaxUnavailable(t *testing.T) {
	ph := startPool(t, poolSetup{comingUp: 300 * time.Millisecond})
	ph.newPool("heal", 3, func(p *v1alpha1.ProxyPool) {
		p.Spec.ReplaceUnhealthyAfter = &metav1.Duration{Duration: 2 * time.Second}
		p.Spec.MaxSurge, p.Spec.MaxUnavailable = ptr32(1), ptr32(1)
	})
	_, before := ph.waitPool("heal", "3 Ready", settled(3))
	stop := ph.watchInvariant("heal", func(ps []v1alpha1.Proxy) string {
		if n := len(live(ps)); n > 4 {
			return fmt.Sprintf("%d Proxies in service or coming up, above replicas+maxSurge 4", n)
		}
		if n := readyCount(ps); n < 2 {
			return fmt.Sprintf("%d Ready, below replicas-maxUnavailable 2", n)
		}
		return ""
	})
	defer stop()
	sick := before[1]
	ph.health.set(types.NamespacedName{Namespace: ph.ns, Name: sick.Name}, HealthSnapshot{Known: true, Healthy: false, Message: "probe: connection refused", CheckedAt: time.Now()})
	p, _ := ph.waitPool("heal", "waiting to replace", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionHealing)
		return c != nil && c.Reason == v1alpha1.ReasonWaitingToReplace
	})
	if c := p.Condition(v1alpha1.ConditionHealing); !strings.Contains(c.Message, sick.Name) || !strings.Contains(c.Message, "connection refused") {
		t.Errorf("Healing message %q does not name the Proxy and why", c.Message)
	}
	_, after := ph.waitPool("heal", "the unhealthy Proxy replaced", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		return settled(3)(p, ps) && !slices.Contains(proxyNames(ps), sick.Name)
	})
	for _, px := range before {
		if px.Name != sick.Name && !slices.Contains(proxyNames(after), px.Name) {
			t.Errorf("healthy Proxy %s was replaced too", px.Name)
		}
	}
	ph.waitPool("heal", "Healing False once none is unhealthy", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionHealing)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonNoneUnhealthy && p.Status.FailedReplacementRounds == 0
	})
}

func TestProxyPoolBacksOffWhenEveryReplacementFails(t *testing.T) {
	ph := startPool(t, poolSetup{})
	ph.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrPermanent, "image not found in project"))
	ph.newPool("broken", 2, func(p *v1alpha1.ProxyPool) {
		p.Spec.ReplaceUnhealthyAfter = &metav1.Duration{Duration: time.Second}
	})
	p, _ := ph.waitPool("broken", "backed off", func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionHealing)
		return c != nil && c.Reason == v1alpha1.ReasonReplacementBackoff && p.Status.FailedReplacementRounds >= 2
	})
	c := p.Condition(v1alpha1.ConditionHealing)
	if !strings.Contains(c.Message, "image not found") || !strings.Contains(c.Message, "keeps failing") {
		t.Errorf("Healing message %q does not say why", c.Message)
	}
	// Rounds at 1s, then 2s, 4s, 8s... after the last: over the next 6 s
	// at most one more round of 2 Proxies, never a storm.
	creates := func() int { return len(ph.fake.Creates()) }
	start := creates()
	rounds := p.Status.FailedReplacementRounds
	time.Sleep(6 * time.Second)
	if n := creates() - start; n > 2*2 {
		t.Fatalf("%d provider Creates in 6s after %d failed rounds, want at most a round's worth", n, rounds)
	}
	if ps := ph.proxies("broken"); len(live(ps)) > 2 {
		t.Fatalf("%d Proxies in service, want 2 (replicas): %s", len(live(ps)), describePool(ph.getPool("broken"), ps))
	}
}

// A round of replacements is judged by whether a Proxy made since became
// Ready. The Proxies' creation times are the API server's, so the round's
// time must be too: with the controller's clock a few seconds ahead, every
// Ready replacement looked older than its round, each later round counted
// as failed, and the pool backed off towards an hour, saying the provider
// kept failing when every replacement had worked.
func TestProxyPoolJudgesAReplacementRoundByTheAPIServersClock(t *testing.T) {
	tests := []struct {
		name string
		skew time.Duration
	}{
		{"controller clock 3s ahead of the API server", 3 * time.Second},
		{"controller clock 3s behind the API server", -3 * time.Second},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ph := startPool(t, poolSetup{skew: tc.skew})
			name := fmt.Sprintf("skew-%d", i)
			ph.newPool(name, 1, func(p *v1alpha1.ProxyPool) {
				p.Spec.ReplaceUnhealthyAfter = &metav1.Duration{Duration: time.Second}
			})
			_, ps := ph.waitPool(name, "1 Ready", settled(1))
			sick := []string{ps[0].Name}
			for round := 1; round <= 2; round++ {
				ph.health.set(types.NamespacedName{Namespace: ph.ns, Name: sick[len(sick)-1]},
					HealthSnapshot{Known: true, Healthy: false, Message: "probe: connection refused", CheckedAt: time.Now()})
				_, ps = ph.waitPool(name, fmt.Sprintf("round %d: the unhealthy Proxy replaced by a Ready one", round),
					func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
						return settled(1)(p, ps) && !slices.Contains(sick, ps[0].Name)
					})
				sick = append(sick, ps[0].Name)
			}
			p, _ := ph.waitPool(name, "no failed round: every replacement became Ready", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
				c := p.Condition(v1alpha1.ConditionHealing)
				return c != nil && c.Reason == v1alpha1.ReasonNoneUnhealthy && p.Status.FailedReplacementRounds == 0
			})
			if last := p.Status.LastReplacementTime; last == nil || last.After(ps[0].CreationTimestamp.Time) {
				t.Errorf("lastReplacementTime %v is after the replacement's creation %v", last, ps[0].CreationTimestamp)
			}
		})
	}
}
