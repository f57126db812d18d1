package controller

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// poolMember is one Proxy of a pool as the pool's decisions see it: in
// service or coming up, neither draining nor being deleted.
type poolMember struct {
	// Name is the Proxy's name.
	Name string
	// Created is the Proxy's creation time (age, maxAge, the oldest-first rule).
	Created time.Time
	// Ready: Healthy, so the lease API offers it.
	Ready bool
	// Unhealthy: a verdict (or a provider failure) says it does not work,
	// as opposed to not having a verdict yet.
	Unhealthy bool
	// Updated: made from the current template and younger than maxAge.
	Updated bool
	// Leases is how many active leases the lease store holds on it.
	Leases int
}

// removalRank orders Proxies for removal: the first is removed first.
// Unhealthy ones go first, then those not Ready yet, then Proxies of an old
// template or past maxAge, then those with fewer active leases (none first),
// then the oldest.
func removalRank(a, b poolMember) int {
	rank := func(m poolMember) int {
		switch {
		case m.Unhealthy:
			return 0
		case !m.Ready:
			return 1
		}
		return 2
	}
	upd := func(m poolMember) int {
		if m.Updated {
			return 1
		}
		return 0
	}
	return cmp.Or(
		cmp.Compare(rank(a), rank(b)),
		cmp.Compare(upd(a), upd(b)),
		cmp.Compare(a.Leases, b.Leases),
		a.Created.Compare(b.Created),
		cmp.Compare(a.Name, b.Name),
	)
}

// removalOrder returns ms sorted by removalRank, leaving ms as it is.
func removalOrder(ms []poolMember) []poolMember {
	out := slices.Clone(ms)
	slices.SortStableFunc(out, removalRank)
	return out
}

// poolPlan is what one pass does to a pool's Proxies.
type poolPlan struct {
	// Create is how many Proxies to create from the current template.
	Create int
	// Drain names the Proxies to start draining, in removal order.
	Drain []string
}

// planPool decides one step towards replicas Proxies, all Updated, from the
// members in service or coming up (draining ones are already on their way
// out and not passed in). The rules, in the manner of a Deployment:
//
//   - Updated Proxies beyond replicas are drained (plain scale-down), in
//     removal order.
//   - Old Proxies (another template, or past maxAge) that are not Ready are
//     drained at once: they carry no capacity.
//   - A Ready old Proxy is drained only while the Ready count stays at or
//     above a floor: replicas when maxSurge > 0 (surge first; an old Proxy
//     goes only once a replacement is Ready), replicas − maxUnavailable when
//     maxSurge is 0 (there is no room for a replacement first).
//   - Updated Proxies are created up to replicas, and while old ones remain
//     the total stays within replicas + maxSurge.
func planPool(replicas, maxSurge, maxUnavailable int, members []poolMember) poolPlan {
	var plan poolPlan
	var cur, old []poolMember
	for _, m := range members {
		if m.Updated {
			cur = append(cur, m)
		} else {
			old = append(old, m)
		}
	}
	cur, old = removalOrder(cur), removalOrder(old)
	if extra := len(cur) - replicas; extra > 0 {
		for _, m := range cur[:extra] {
			plan.Drain = append(plan.Drain, m.Name)
		}
		cur = cur[extra:]
	}
	ready := 0
	for _, m := range slices.Concat(cur, old) {
		if m.Ready {
			ready++
		}
	}
	floor := replicas
	if maxSurge == 0 {
		floor = replicas - maxUnavailable
	}
	floor = max(floor, 0)
	oldLeft := len(old)
	for _, m := range old {
		if m.Ready {
			if ready-1 < floor {
				break // the rest are Ready too (removal order puts not-Ready first)
			}
			ready--
		}
		plan.Drain = append(plan.Drain, m.Name)
		oldLeft--
	}
	want := replicas - len(cur)
	if oldLeft > 0 {
		want = min(want, replicas+maxSurge-len(cur)-oldLeft)
	}
	plan.Create = max(want, 0)
	return plan
}

// drainDone reports whether a draining Proxy may be deleted now: its
// leases ended and the lease store no longer offers it (the drain reached
// the store, so no lease can be granted between the check and the delete),
// or its drain time is up.
func drainDone(leases int, offered bool, since time.Time, timeout time.Duration, now time.Time) bool {
	if !now.Before(since.Add(timeout)) {
		return true
	}
	return leases == 0 && !offered
}

// autoscaleInput is what the autoscaler decides from.
type autoscaleInput struct {
	// Current is spec.replicas.
	Current int32
	// Min, Max and Target are spec.autoscaling's, defaulted.
	Min, Max, Target int32
	// ScaleDownDelay is spec.autoscaling.scaleDownDelaySeconds.
	ScaleDownDelay time.Duration
	// ActiveLeases counts the active leases on the pool's Proxies, draining
	// ones included (that demand has to go somewhere).
	ActiveLeases int
	// LastRefusal is the latest refused (409) lease request the pool would
	// have matched, within the refusal window; zero when none.
	LastRefusal time.Time
	// LastScaleTime is when the autoscaler last changed replicas; zero when never.
	LastScaleTime time.Time
	// ComingUp counts the pool's Proxies without a health verdict yet: a
	// refusal-driven step waits until the previous one has landed.
	ComingUp int
	// LastLanded is when a Proxy of the pool last turned Ready; zero when
	// none is. A refusal from before it was made without that Proxy, so it
	// does not count: it would step up again for a step that has landed.
	LastLanded time.Time
	// ScaleDownSince is when a smaller size was first computed; zero when not.
	ScaleDownSince time.Time
	// Now is the decision time.
	Now time.Time
}

// autoscaleDecision is the autoscaler's verdict, with the words for the
// conditions.
type autoscaleDecision struct {
	// Replicas is the size to set; Current when nothing changes.
	Replicas int32
	// ScaleDownSince is the new status.scaleDownSince (zero: clear it).
	ScaleDownSince time.Time
	// Reason and Message are for AbleToScale.
	Reason, Message string
	// Limited says the computed size was clamped; LimitReason and
	// LimitMessage are for ScalingLimited.
	Limited                   bool
	LimitReason, LimitMessage string
}

// decideAutoscale computes the pool's size from its leases: ⌈active leases ÷
// target⌉, or one more than now when a matching request was refused after
// the last change and after the last Proxy turned Ready, and nothing is
// still coming up, clamped to [min, max].
// A larger size applies at once; a smaller one only after it has been
// computed for ScaleDownDelay without interruption.
func decideAutoscale(in autoscaleInput) autoscaleDecision {
	byLeases := int32((in.ActiveLeases + int(in.Target) - 1) / int(in.Target))
	want := byLeases
	why := fmt.Sprintf("%d active leases at a target of %d per Proxy need %d", in.ActiveLeases, in.Target, byLeases)
	refused := !in.LastRefusal.IsZero() && in.LastRefusal.After(in.LastScaleTime) && in.LastRefusal.After(in.LastLanded)
	switch {
	case refused && in.ComingUp > 0:
		why += fmt.Sprintf("; lease requests were refused, but %d Proxies are still coming up", in.ComingUp)
	case refused && in.Current+1 > want:
		want = in.Current + 1
		why += fmt.Sprintf("; lease requests matching the pool were refused (last at %s), so one more than %d",
			in.LastRefusal.UTC().Format(time.RFC3339), in.Current)
	}
	d := autoscaleDecision{LimitReason: v1alpha1.ReasonDesiredWithinRange, LimitMessage: "the computed size is within [minReplicas, maxReplicas]"}
	switch {
	case want > in.Max:
		d.Limited, d.LimitReason = true, v1alpha1.ReasonTooManyReplicas
		d.LimitMessage = fmt.Sprintf("the computed size %d is above maxReplicas %d", want, in.Max)
		want = in.Max
	case want < in.Min:
		d.Limited, d.LimitReason = true, v1alpha1.ReasonTooFewReplicas
		d.LimitMessage = fmt.Sprintf("the computed size %d is below minReplicas %d", want, in.Min)
		want = in.Min
	}
	switch {
	case want > in.Current || in.Current > in.Max:
		// Up at once; a size above maxReplicas (set by hand) comes down at once too.
		d.Replicas, d.Reason = want, v1alpha1.ReasonSucceededRescale
		d.Message = fmt.Sprintf("set replicas from %d to %d: %s", in.Current, want, why)
	case want == in.Current:
		d.Replicas, d.Reason = in.Current, v1alpha1.ReasonReadyForNewScale
		d.Message = fmt.Sprintf("replicas %d is right: %s", in.Current, why)
	default:
		since := in.ScaleDownSince
		if since.IsZero() {
			since = in.Now
		}
		if until := since.Add(in.ScaleDownDelay); in.Now.Before(until) {
			d.Replicas, d.Reason, d.ScaleDownSince = in.Current, v1alpha1.ReasonScaleDownDelayed, since
			d.Message = fmt.Sprintf("holding replicas at %d until %s, then %d unless demand returns: %s",
				in.Current, until.UTC().Format(time.RFC3339), want, why)
			break
		}
		d.Replicas, d.Reason = want, v1alpha1.ReasonSucceededRescale
		d.Message = fmt.Sprintf("set replicas from %d to %d after %s below it: %s", in.Current, want, in.ScaleDownDelay, why)
	}
	return d
}

// healMember is one pool member as the healing rule sees it.
type healMember struct {
	// Name is the Proxy's name.
	Name string
	// Created is the Proxy's creation time.
	Created time.Time
	// Ready: Healthy, in service.
	Ready bool
	// UnhealthySince is when it turned Unhealthy or Failed; zero when it is
	// neither.
	UnhealthySince time.Time
	// Why is its condition's message, for the pool's condition.
	Why string
}

// healInput is what the healing rule decides from.
type healInput struct {
	// After is spec.replaceUnhealthyAfter; 0 turns healing off.
	After time.Duration
	// Members are the pool's Proxies in service or coming up.
	Members []healMember
	// FailedRounds and LastReplacement are the status the previous rounds left.
	FailedRounds    int
	LastReplacement time.Time
	// Now is the decision time.
	Now time.Time
}

// healDecision is the healing rule's verdict.
type healDecision struct {
	// Replace names the members to replace now.
	Replace []string
	// FailedRounds and LastReplacement are the status to record.
	FailedRounds    int
	LastReplacement time.Time
	// Wake is when a waiting member falls due; zero when none waits.
	Wake time.Time
	// Status, Reason and Message are the Healing condition's; Reason is
	// empty when healing is off.
	Status          metav1.ConditionStatus
	Reason, Message string
}

// healBackoff is how long a round waits after the last one when failed
// rounds went before it: After doubled per failed round, capped at
// MaxHealBackoff (or After, when that is longer).
func healBackoff(after time.Duration, failed int) time.Duration {
	limit := max(after, v1alpha1.MaxHealBackoff)
	d := after
	for range failed {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// decideHeal picks the members to replace: each Unhealthy or Failed for
// After. A round that finds no Proxy created since the last round Ready
// counts as failed (the replacements went bad too: the provider keeps
// failing), and a failed round waits healBackoff after the last one, so a
// provider that always fails costs a round per doubling interval instead of
// a storm of Creates. A Ready Proxy made since the last round resets the
// count.
func decideHeal(in healInput) healDecision {
	d := healDecision{FailedRounds: in.FailedRounds, LastReplacement: in.LastReplacement}
	if in.After <= 0 {
		return d
	}
	recovered := in.LastReplacement.IsZero()
	for _, m := range in.Members {
		if m.Ready && !m.Created.Before(in.LastReplacement) {
			recovered = true
		}
	}
	if recovered {
		d.FailedRounds = 0
	}
	failed := in.FailedRounds + 1
	if recovered {
		failed = 0
	}
	gate := time.Time{}
	if failed > 0 {
		gate = in.LastReplacement.Add(healBackoff(in.After, failed))
	}
	var waiting []healMember
	var firstWhy string
	for _, m := range in.Members {
		if m.UnhealthySince.IsZero() {
			continue
		}
		due := m.UnhealthySince.Add(in.After)
		if due.Before(gate) {
			due = gate
		}
		if in.Now.Before(due) {
			waiting = append(waiting, m)
			if d.Wake.IsZero() || due.Before(d.Wake) {
				d.Wake = due
			}
			continue
		}
		d.Replace = append(d.Replace, m.Name)
		if firstWhy == "" {
			firstWhy = m.Name + ": " + m.Why
		}
	}
	switch {
	case len(d.Replace) > 0:
		d.FailedRounds, d.LastReplacement = failed, in.Now
		d.Status, d.Reason = metav1.ConditionTrue, v1alpha1.ReasonReplacingUnhealthy
		d.Message = fmt.Sprintf("replacing %d Proxies Unhealthy or Failed for %s or more (%s)", len(d.Replace), in.After, firstWhy)
		if failed > 0 {
			d.Message += fmt.Sprintf("; %d rounds before this one brought no Ready Proxy, so the next waits %s", failed, healBackoff(in.After, failed+1))
		}
	case len(waiting) > 0 && failed > 0 && d.Wake.Equal(gate):
		d.Status, d.Reason = metav1.ConditionTrue, v1alpha1.ReasonReplacementBackoff
		d.Message = fmt.Sprintf("%d Proxies are Unhealthy or Failed (%s: %s), and the last %d rounds of replacements went Unhealthy or Failed too: the provider keeps failing, so the next round waits until %s",
			len(waiting), waiting[0].Name, waiting[0].Why, failed, gate.UTC().Format(time.RFC3339))
	case len(waiting) > 0:
		d.Status, d.Reason = metav1.ConditionTrue, v1alpha1.ReasonWaitingToReplace
		d.Message = fmt.Sprintf("%d Proxies are Unhealthy or Failed (%s: %s); replaced at %s unless they recover",
			len(waiting), waiting[0].Name, waiting[0].Why, d.Wake.UTC().Format(time.RFC3339))
	default:
		d.Status, d.Reason, d.Message = metav1.ConditionFalse, v1alpha1.ReasonNoneUnhealthy, "no Proxy is Unhealthy or Failed"
	}
	return d
}
