package providerhealth

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

var (
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Minute)
)

func up(name string) providers.TargetStatus {
	return providers.TargetStatus{Target: name, Ready: true, Reason: "OK", Message: "fine"}
}

func down(name, reason string) providers.TargetStatus {
	return providers.TargetStatus{Target: name, Reason: reason, Message: "broken"}
}

func TestBuildStatus(t *testing.T) {
	// prev is what the object holds after a round at t0 with a ready and a
	// failing target.
	prev := buildStatus(v1alpha1.ProviderHealthStatus{},
		Result{Type: "kvm", Targets: []providers.TargetStatus{up("a"), down("b", "Unreachable")}, CheckedAt: t0}, 1, t0)

	tests := []struct {
		name        string
		targets     []providers.TargetStatus
		wantReady   bool
		wantCount   string
		wantReason  string
		wantTTimes  map[string]time.Time // per-target lastTransitionTime
		wantCondLTT time.Time
	}{
		{
			name:      "a steady round keeps every lastTransitionTime",
			targets:   []providers.TargetStatus{up("a"), down("b", "Unreachable")},
			wantReady: false, wantCount: "1/2", wantReason: "Unreachable",
			wantTTimes: map[string]time.Time{"a": t0, "b": t0}, wantCondLTT: t0,
		},
		{
			name:      "a target that flips gets a new lastTransitionTime, the others keep theirs",
			targets:   []providers.TargetStatus{up("a"), up("b")},
			wantReady: true, wantCount: "2/2", wantReason: ReasonAllTargetsReady,
			wantTTimes: map[string]time.Time{"a": t0, "b": t1}, wantCondLTT: t1,
		},
		{
			name:      "a reason change without a flip keeps the time",
			targets:   []providers.TargetStatus{up("a"), down("b", "Forbidden")},
			wantReady: false, wantCount: "1/2", wantReason: "Forbidden",
			wantTTimes: map[string]time.Time{"a": t0, "b": t0}, wantCondLTT: t0,
		},
		{
			name:      "a new target starts now",
			targets:   []providers.TargetStatus{up("a"), down("b", "Unreachable"), up("c")},
			wantReady: false, wantCount: "2/3", wantReason: "Unreachable",
			wantTTimes: map[string]time.Time{"a": t0, "b": t0, "c": t1}, wantCondLTT: t0,
		},
		{
			name:      "no targets is not ready",
			targets:   nil,
			wantReady: false, wantCount: "0/0", wantReason: ReasonNoTargets,
			wantTTimes: map[string]time.Time{}, wantCondLTT: t0,
		},
		{
			name:      "a failing target's reason that is no valid condition reason is replaced",
			targets:   []providers.TargetStatus{up("a"), down("b", "not a reason!")},
			wantReady: false, wantCount: "1/2", wantReason: ReasonTargetNotReady,
			wantTTimes: map[string]time.Time{"a": t0, "b": t0}, wantCondLTT: t0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := buildStatus(prev, Result{Type: "kvm", Targets: tc.targets, CheckedAt: t1}, 1, t1)
			if st.Ready != tc.wantReady || st.TargetsReady != tc.wantCount || st.Type != "kvm" {
				t.Errorf("ready=%v targetsReady=%q type=%q, want %v %q kvm", st.Ready, st.TargetsReady, st.Type, tc.wantReady, tc.wantCount)
			}
			if st.LastCheckTime == nil || !st.LastCheckTime.Time.Equal(t1) {
				t.Errorf("lastCheckTime = %v, want %v", st.LastCheckTime, t1)
			}
			got := map[string]time.Time{}
			for _, pt := range st.Targets {
				got[pt.Name] = pt.LastTransitionTime.Time
			}
			if !reflect.DeepEqual(got, tc.wantTTimes) {
				t.Errorf("target transition times %v, want %v", got, tc.wantTTimes)
			}
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
			if c == nil {
				t.Fatal("no Ready condition")
			}
			wantStatus := metav1.ConditionFalse
			if tc.wantReady {
				wantStatus = metav1.ConditionTrue
			}
			if c.Status != wantStatus || c.Reason != tc.wantReason || !c.LastTransitionTime.Time.Equal(tc.wantCondLTT) || c.ObservedGeneration != 1 {
				t.Errorf("Ready condition %+v, want status %s reason %s since %v", c, wantStatus, tc.wantReason, tc.wantCondLTT)
			}
		})
	}
}

func TestBuildStatusMessageNamesEveryFailingTarget(t *testing.T) {
	st := buildStatus(v1alpha1.ProviderHealthStatus{},
		Result{Targets: []providers.TargetStatus{down("h1", "Unreachable"), up("h2"), down("h3", "PoolInactive")}, CheckedAt: t0}, 1, t0)
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	for _, want := range []string{"1/3 targets ready", "h1: Unreachable: broken", "h3: PoolInactive: broken"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	if c.Reason != "Unreachable" {
		t.Errorf("reason %q, want the first failing target's", c.Reason)
	}
}

func TestNormalizeTargets(t *testing.T) {
	got := normalizeTargets([]providers.TargetStatus{up("z"), down("a", "X"), up(""), down("z", "Dup")})
	var names []string
	for _, g := range got {
		names = append(names, g.Target)
	}
	if want := []string{"a", "unnamed", "z"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("names %v, want %v (sorted, unique, none empty)", names, want)
	}
	if !got[2].Ready {
		t.Errorf("a repeated target replaced the first verdict: %+v", got[2])
	}
}

func TestTransitions(t *testing.T) {
	tests := []struct {
		name      string
		prev, cur []providers.TargetStatus
		want      []transition
	}{
		{"a steady ready target is silent", []providers.TargetStatus{up("a")}, []providers.TargetStatus{up("a")}, nil},
		{"a steady failing target with the same reason is silent", []providers.TargetStatus{down("a", "X")}, []providers.TargetStatus{down("a", "X")}, nil},
		{"going down is a down transition", []providers.TargetStatus{up("a")}, []providers.TargetStatus{down("a", "X")},
			[]transition{{ready: false, target: down("a", "X")}}},
		{"a changed reason while down is a down transition", []providers.TargetStatus{down("a", "X")}, []providers.TargetStatus{down("a", "Y")},
			[]transition{{ready: false, target: down("a", "Y")}}},
		{"coming back is an up transition", []providers.TargetStatus{down("a", "X")}, []providers.TargetStatus{up("a")},
			[]transition{{ready: true, target: up("a")}}},
		{"the first round reports both verdicts", nil, []providers.TargetStatus{up("a"), down("b", "X")},
			[]transition{{ready: true, target: up("a")}, {ready: false, target: down("b", "X")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := transitions(tc.prev, tc.cur); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("transitions = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEffectiveTimeout(t *testing.T) {
	tests := []struct {
		name              string
		interval, timeout time.Duration
		want              time.Duration
	}{
		{"an explicit timeout wins", time.Minute, 5 * time.Second, 5 * time.Second},
		{"the default is 15s under a long interval", time.Minute, 0, DefaultTimeout},
		{"a short interval caps the default", 12 * time.Second, 0, 12 * time.Second},
		{"checks off still has a sane value", 0, 0, DefaultTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := effectiveTimeout(tc.interval, tc.timeout); got != tc.want {
				t.Fatalf("effectiveTimeout(%s, %s) = %s, want %s", tc.interval, tc.timeout, got, tc.want)
			}
		})
	}
}

// countingRecorder counts provider requests the metrics decorator records.
type countingRecorder struct{ n atomic.Int64 }

func (r *countingRecorder) ProviderRequest(string, string, string) { r.n.Add(1) }

func TestCheckersFromLooksThroughTheMetricsDecorator(t *testing.T) {
	rec := &countingRecorder{}
	inner := providertest.NewChecker(up("api"))
	provs := map[string]providers.Provider{
		"checked":   providers.WithMetrics(inner, "checked", rec),
		"unchecked": providers.WithMetrics(providertest.New(), "unchecked", rec),
	}
	got := CheckersFrom(provs)
	if len(got) != 1 {
		t.Fatalf("CheckersFrom = %v, want only the provider that implements Checker", got)
	}
	if c, ok := got["checked"].(*providertest.Checker); !ok || c != inner {
		t.Fatalf("CheckersFrom returned %T, want the undecorated provider", got["checked"])
	}
	got["checked"].Check(context.Background())
	if n := rec.n.Load(); n != 0 {
		t.Fatalf("a check was recorded as %d provider requests", n)
	}
}
