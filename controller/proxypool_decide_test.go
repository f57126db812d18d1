package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/pool"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// pm builds a poolMember: ready and updated unless the flags say otherwise.
func pm(name string, ageMin int, leases int, flags ...string) poolMember {
	m := poolMember{Name: name, Created: t0.Add(-time.Duration(ageMin) * time.Minute), Ready: true, Updated: true, Leases: leases}
	for _, f := range flags {
		switch f {
		case "unhealthy":
			m.Ready, m.Unhealthy = false, true
		case "coming":
			m.Ready = false
		case "old":
			m.Updated = false
		}
	}
	return m
}

func names(ms []poolMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestRemovalOrderIsUnhealthyThenUnleasedThenOldest(t *testing.T) {
	tests := []struct {
		name    string
		members []poolMember
		want    []string
	}{
		{
			name:    "unhealthy before an idle healthy one",
			members: []poolMember{pm("idle", 1, 0), pm("sick", 1, 5, "unhealthy")},
			want:    []string{"sick", "idle"},
		},
		{
			name:    "no lease before leased, though younger",
			members: []poolMember{pm("old-leased", 60, 2), pm("young-idle", 1, 0)},
			want:    []string{"young-idle", "old-leased"},
		},
		{
			name:    "among idle ones the oldest first",
			members: []poolMember{pm("b", 5, 0), pm("a", 30, 0), pm("c", 10, 0)},
			want:    []string{"a", "c", "b"},
		},
		{
			name:    "unhealthy, then not Ready yet, then Ready",
			members: []poolMember{pm("ready", 1, 0), pm("coming", 1, 0, "coming"), pm("sick", 1, 0, "unhealthy")},
			want:    []string{"sick", "coming", "ready"},
		},
		{
			name:    "fewer leases before more",
			members: []poolMember{pm("three", 9, 3), pm("one", 1, 1)},
			want:    []string{"one", "three"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(removalOrder(tc.members)); !slices.Equal(got, tc.want) {
				t.Errorf("order = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlanPool(t *testing.T) {
	tests := []struct {
		name         string
		replicas     int
		surge, unav  int
		members      []poolMember
		wantCreate   int
		wantDrain    []string
		wantDrainLen int // when the names do not matter
	}{
		{name: "empty pool creates replicas", replicas: 3, surge: 1, unav: 1, wantCreate: 3},
		{name: "steady pool does nothing", replicas: 2, surge: 1, unav: 1,
			members: []poolMember{pm("a", 1, 0), pm("b", 2, 0)}},
		{name: "scale-down drains in removal order", replicas: 1, surge: 1, unav: 1,
			members:   []poolMember{pm("leased", 50, 1), pm("idle-old", 40, 0), pm("idle-young", 1, 0)},
			wantDrain: []string{"idle-old", "idle-young"}},
		{name: "scale to zero drains everything", replicas: 0, surge: 1, unav: 1,
			members: []poolMember{pm("a", 1, 3), pm("b", 2, 0)}, wantDrain: []string{"b", "a"}},
		{name: "rollout with surge: first a new one, no old one drained yet", replicas: 3, surge: 1, unav: 1,
			members:    []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old")},
			wantCreate: 1},
		{name: "rollout with surge: the replacement is not Ready, so nothing moves", replicas: 3, surge: 1, unav: 1,
			members: []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old"), pm("n1", 0, 0, "coming")}},
		{name: "rollout with surge: the replacement is Ready, the oldest idle old one drains and the next replacement comes", replicas: 3, surge: 1, unav: 1,
			members:    []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 2, "old"), pm("o3", 7, 0, "old"), pm("n1", 0, 0)},
			wantDrain:  []string{"o1"},
			wantCreate: 1},
		{name: "rollout without surge: maxUnavailable old ones go first, their replacements in the same step", replicas: 3, surge: 0, unav: 1,
			members:    []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old")},
			wantDrain:  []string{"o1"},
			wantCreate: 1},
		{name: "rollout without surge: the replacement not Ready yet holds the next drain", replicas: 3, surge: 0, unav: 1,
			members: []poolMember{pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old"), pm("n1", 0, 0, "coming")}},
		{name: "rollout without surge, maxUnavailable 2: two at once", replicas: 3, surge: 0, unav: 2,
			members:    []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old")},
			wantDrain:  []string{"o1", "o2"},
			wantCreate: 2},
		{name: "old ones that are not Ready go at once, whatever the floor", replicas: 2, surge: 1, unav: 0,
			members:    []poolMember{pm("o1", 9, 0, "old", "unhealthy"), pm("o2", 8, 0, "old", "unhealthy")},
			wantDrain:  []string{"o1", "o2"},
			wantCreate: 2},
		{name: "surge 2: two replacements at once", replicas: 2, surge: 2, unav: 0,
			members:    []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old")},
			wantCreate: 2},
		{name: "scale-down during a rollout drains old ones down to the floor", replicas: 2, surge: 1, unav: 1,
			members: []poolMember{pm("o1", 9, 0, "old"), pm("o2", 8, 0, "old"), pm("o3", 7, 0, "old"),
				pm("o4", 6, 0, "old"), pm("n1", 0, 0)},
			wantDrain:  []string{"o1", "o2", "o3"},
			wantCreate: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := planPool(tc.replicas, tc.surge, tc.unav, tc.members)
			if got.Create != tc.wantCreate {
				t.Errorf("create = %d, want %d", got.Create, tc.wantCreate)
			}
			if !slices.Equal(got.Drain, tc.wantDrain) {
				t.Errorf("drain = %v, want %v", got.Drain, tc.wantDrain)
			}
			// The invariants, whatever the case: never below the Ready floor
			// through drains of Ready old Proxies, never above replicas+surge.
			ready, total := 0, len(tc.members)-len(got.Drain)+got.Create
			for _, m := range tc.members {
				if m.Ready && !slices.Contains(got.Drain, m.Name) {
					ready++
				}
			}
			floor := tc.replicas
			if tc.surge == 0 {
				floor = tc.replicas - tc.unav
			}
			before := 0
			for _, m := range tc.members {
				if m.Ready {
					before++
				}
			}
			if ready < floor && ready < before {
				t.Errorf("Ready %d after the plan, below the floor %d", ready, floor)
			}
			if total > tc.replicas+tc.surge && total > len(tc.members) {
				t.Errorf("%d Proxies after the plan, above replicas+maxSurge %d", total, tc.replicas+tc.surge)
			}
		})
	}
}

func TestDrainDone(t *testing.T) {
	tests := []struct {
		name    string
		leases  int
		offered bool
		elapsed time.Duration
		want    bool
	}{
		{"a held lease keeps it within drainSeconds", 1, false, 10 * time.Second, false},
		{"no leases but the store still offers it: wait for the drain to reach the store", 0, true, time.Second, false},
		{"no leases and no longer offered: delete", 0, false, time.Second, true},
		{"drainSeconds up: delete although a lease is held", 2, false, time.Minute, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := drainDone(tc.leases, tc.offered, t0, time.Minute, t0.Add(tc.elapsed)); got != tc.want {
				t.Errorf("drainDone = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDecideAutoscale(t *testing.T) {
	base := autoscaleInput{Current: 2, Min: 1, Max: 5, Target: 10, ScaleDownDelay: time.Minute, Now: t0}
	with := func(f func(*autoscaleInput)) autoscaleInput { in := base; f(&in); return in }
	tests := []struct {
		name        string
		in          autoscaleInput
		want        int32
		reason      string
		limited     string
		downSince   time.Time
		msgContains string
	}{
		{name: "leases at target keep the size", in: with(func(in *autoscaleInput) { in.ActiveLeases = 20 }),
			want: 2, reason: v1alpha1.ReasonReadyForNewScale, limited: v1alpha1.ReasonDesiredWithinRange},
		{name: "leases above target scale up at once, rounding up", in: with(func(in *autoscaleInput) { in.ActiveLeases = 31 }),
			want: 4, reason: v1alpha1.ReasonSucceededRescale, msgContains: "31 active leases"},
		{name: "scale-up clamped to maxReplicas", in: with(func(in *autoscaleInput) { in.ActiveLeases = 500 }),
			want: 5, reason: v1alpha1.ReasonSucceededRescale, limited: v1alpha1.ReasonTooManyReplicas},
		{name: "a refusal after the last change steps up by one", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.LastRefusal, in.LastScaleTime = 20, t0.Add(-5*time.Second), t0.Add(-time.Minute)
		}), want: 3, reason: v1alpha1.ReasonSucceededRescale, msgContains: "refused"},
		{name: "a refusal before the last change does not step again", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.LastRefusal, in.LastScaleTime = 20, t0.Add(-time.Minute), t0.Add(-5*time.Second)
		}), want: 2, reason: v1alpha1.ReasonReadyForNewScale},
		{name: "a refusal while a Proxy is still coming up waits", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.LastRefusal, in.ComingUp = 20, t0.Add(-time.Second), 1
		}), want: 2, reason: v1alpha1.ReasonReadyForNewScale, msgContains: "still coming up"},
		{name: "a refusal from before the last step's Proxy turned Ready does not step again", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.LastScaleTime, in.LastRefusal, in.LastLanded = 20, t0.Add(-time.Minute), t0.Add(-30*time.Second), t0.Add(-20*time.Second)
		}), want: 2, reason: v1alpha1.ReasonReadyForNewScale},
		{name: "a refusal after the last step's Proxy turned Ready steps up by one", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.LastScaleTime, in.LastLanded, in.LastRefusal = 20, t0.Add(-time.Minute), t0.Add(-30*time.Second), t0.Add(-20*time.Second)
		}), want: 3, reason: v1alpha1.ReasonSucceededRescale, msgContains: "refused"},
		{name: "a refusal at an empty pool with min 0 brings the first Proxy", in: with(func(in *autoscaleInput) {
			in.Current, in.Min, in.LastRefusal = 0, 0, t0.Add(-time.Second)
		}), want: 1, reason: v1alpha1.ReasonSucceededRescale},
		{name: "a refusal at maxReplicas is limited", in: with(func(in *autoscaleInput) {
			in.Current, in.ActiveLeases, in.LastRefusal = 5, 50, t0.Add(-time.Second)
		}), want: 5, reason: v1alpha1.ReasonReadyForNewScale, limited: v1alpha1.ReasonTooManyReplicas},
		{name: "below target: hold and remember since when", in: with(func(in *autoscaleInput) { in.ActiveLeases = 3 }),
			want: 2, reason: v1alpha1.ReasonScaleDownDelayed, downSince: t0, msgContains: "holding replicas at 2"},
		{name: "below target for the whole delay: scale down", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.ScaleDownSince = 3, t0.Add(-time.Minute)
		}), want: 1, reason: v1alpha1.ReasonSucceededRescale},
		{name: "no leases: never below minReplicas", in: with(func(in *autoscaleInput) {
			in.ActiveLeases, in.ScaleDownSince = 0, t0.Add(-time.Hour)
		}), want: 1, reason: v1alpha1.ReasonSucceededRescale, limited: v1alpha1.ReasonTooFewReplicas},
		{name: "a size set by hand above maxReplicas comes down at once", in: with(func(in *autoscaleInput) {
			in.Current, in.ActiveLeases = 9, 90
		}), want: 5, reason: v1alpha1.ReasonSucceededRescale, limited: v1alpha1.ReasonTooManyReplicas},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decideAutoscale(tc.in)
			if d.Replicas != tc.want || d.Reason != tc.reason {
				t.Errorf("replicas %d reason %s (%s), want %d %s", d.Replicas, d.Reason, d.Message, tc.want, tc.reason)
			}
			limited := tc.limited
			if limited == "" {
				limited = v1alpha1.ReasonDesiredWithinRange
			}
			if d.LimitReason != limited || d.Limited != (limited != v1alpha1.ReasonDesiredWithinRange) {
				t.Errorf("limit %v %s, want %s", d.Limited, d.LimitReason, limited)
			}
			if !d.ScaleDownSince.Equal(tc.downSince) {
				t.Errorf("scaleDownSince = %s, want %s", d.ScaleDownSince, tc.downSince)
			}
			if tc.msgContains != "" && !strings.Contains(d.Message, tc.msgContains) {
				t.Errorf("message %q does not contain %q", d.Message, tc.msgContains)
			}
		})
	}
}

func TestPreciseTimeIsNeverEarlierThanTheRealOne(t *testing.T) {
	actual := t0.Add(800 * time.Millisecond)
	stored := metav1.NewTime(actual.Truncate(time.Second)) // what a status round trip keeps
	tests := []struct {
		name       string
		status     *metav1.Time
		remembered time.Time
		want       time.Time
	}{
		{"nothing in status", nil, actual, time.Time{}},
		{"remembered and matching status: the precise time", &stored, actual, actual},
		{"after a restart: status moved a second later", &stored, time.Time{}, stored.Add(time.Second)},
		{"remembered time of an older decision: status wins, conservatively", &stored, actual.Add(-time.Hour), stored.Add(time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := preciseTime(tc.status, tc.remembered)
			if !got.Equal(tc.want) {
				t.Errorf("preciseTime = %s, want %s", got, tc.want)
			}
			if tc.status != nil && got.Before(actual) {
				t.Errorf("%s is earlier than the real time %s", got, actual)
			}
		})
	}
}

// TestMaxAgeSparesAProxyStillComingUp pins which Proxies of the current
// template count as Updated under maxAge: one still coming up (no verdict)
// is never aged out, so a maxAge shorter than a boot cannot replace every
// Proxy before it served; one with a verdict is, healthy or not.
func TestMaxAgeSparesAProxyStillComingUp(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	pl := gen.ProxyPool("eu")
	pl.Spec.MaxAge = &metav1.Duration{Duration: time.Minute}
	healthy := metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded}
	failed := metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProbeFailed}
	for _, tc := range []struct {
		name    string
		age     time.Duration
		healthy *metav1.Condition
		want    bool
	}{
		{"a young Ready Proxy is updated", 30 * time.Second, &healthy, true},
		{"a Ready Proxy past maxAge is replaced", 2 * time.Minute, &healthy, false},
		{"an unhealthy Proxy past maxAge is replaced", 2 * time.Minute, &failed, false},
		{"a Proxy still coming up past maxAge is spared", 2 * time.Minute, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := gen.Proxy("px")
			px.Labels = map[string]string{v1alpha1.LabelPoolTemplateHash: "h1"}
			px.CreationTimestamp = metav1.NewTime(now.Add(-tc.age))
			if tc.healthy != nil {
				px.Status.Conditions = []metav1.Condition{*tc.healthy}
			}
			ps := &poolPass{pool: pl, now: now, hash: "h1"}
			if got := ps.updated(px); got != tc.want {
				t.Fatalf("updated = %v, want %v", got, tc.want)
			}
		})
	}
}

// refusedAt is a lease store whose last refusal matching any pool is at.
type refusedAt time.Time

func (refusedAt) Members() []pool.MemberStatus { return nil }
func (r refusedAt) LastRefusal(func(map[string]string, string) bool) time.Time {
	return time.Time(r)
}

// TestARefusalInTheSecondAProxyLandedDoesNotStepAgain pins how the
// autoscaler reads a landing known only to the second (a Proxy's Healthy
// transition time is truncated): the pool stepped from 0 to 1 at S+0.1 for a
// refusal, a client asked again at S+0.5 while that Proxy was still coming
// up (refused), and the Proxy turned Ready at S+0.8, which status keeps as
// S. That refusal was made without the Proxy and must not step the pool to
// 2; one made after the second of the landing does.
func TestARefusalInTheSecondAProxyLandedDoesNotStepAgain(t *testing.T) {
	s := t0.Add(17 * time.Second)
	stepped := s.Add(100 * time.Millisecond)
	landed := metav1.NewTime(s.Add(800 * time.Millisecond).Truncate(time.Second)) // what status keeps
	pl := gen.ProxyPool("eu", gen.SetProxyPoolReplicas(1))
	pl.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MaxReplicas: 5}
	lastScale := metav1.NewTime(stepped.Truncate(time.Second))
	pl.Status.LastScaleTime = &lastScale
	px := gen.Proxy("eu-1")
	px.Status.Conditions = []metav1.Condition{{
		Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, LastTransitionTime: landed,
	}}
	for _, tc := range []struct {
		name    string
		refusal time.Time
		mem     autoscaleTimes
		want    int32
	}{
		{"a refusal while the step's Proxy came up, in the second it landed, does not step again", s.Add(500 * time.Millisecond), autoscaleTimes{lastScale: stepped}, 1},
		{"the same after a controller restart (the step's time from status)", s.Add(500 * time.Millisecond), autoscaleTimes{}, 1},
		{"a refusal in the second after the landing steps up by one", s.Add(1300 * time.Millisecond), autoscaleTimes{lastScale: stepped}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := &poolPass{pool: pl, now: s.Add(2 * time.Second), proxies: []v1alpha1.Proxy{*px}}
			in := ps.autoscaleInput(refusedAt(tc.refusal), tc.mem)
			if d := decideAutoscale(in); d.Replicas != tc.want {
				t.Errorf("replicas %d (%s), want %d; landed %s, refusal %s", d.Replicas, d.Message, tc.want, in.LastLanded, tc.refusal)
			}
		})
	}
}
