package controller

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// unhealthySince is when a Proxy turned Unhealthy or Failed, and why:
// the Healthy condition's transition to False, or, for a Proxy the
// controller latched as Failed, the Provisioned condition's last
// transition. Zero when it is neither.
func unhealthySince(px *v1alpha1.Proxy) (since metav1.Time, why string) {
	if px.Status.Phase == v1alpha1.PhaseFailed {
		if c := px.Condition(v1alpha1.ConditionProvisioned); c != nil {
			return c.LastTransitionTime, c.Message
		}
		return px.CreationTimestamp, "Failed"
	}
	if c := px.Condition(v1alpha1.ConditionHealthy); c != nil && c.Status == metav1.ConditionFalse {
		return c.LastTransitionTime, c.Message
	}
	return metav1.Time{}, ""
}

// heal decides which unhealthy members this pass replaces (decideHeal),
// stages the pool's healing status and condition, and asks for a pass
// when the next member falls due. The members it returns have those to
// replace marked not Updated, so planPool replaces them as it rolls a
// template: the replacement is created and the old one drained, within
// maxSurge and maxUnavailable.
func (ps *poolPass) heal(members []poolMember) []poolMember {
	p := ps.pool
	in := healInput{After: p.ReplaceUnhealthyAfter(), FailedRounds: int(p.Status.FailedReplacementRounds), Now: ps.now}
	if t := p.Status.LastReplacementTime; t != nil {
		in.LastReplacement = t.Time
	}
	byName := map[string]*v1alpha1.Proxy{}
	for i := range ps.proxies {
		byName[ps.proxies[i].Name] = &ps.proxies[i]
	}
	for _, m := range members {
		hm := healMember{Name: m.Name, Created: m.Created, Ready: m.Ready}
		if px := byName[m.Name]; px != nil && m.Unhealthy {
			since, why := unhealthySince(px)
			hm.UnhealthySince, hm.Why = since.Time, why
		}
		in.Members = append(in.Members, hm)
	}
	d := decideHeal(in)
	if d.Reason == "" {
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionHealing)
		p.Status.FailedReplacementRounds, p.Status.LastReplacementTime = 0, nil
		return members
	}
	p.Status.FailedReplacementRounds = int32(d.FailedRounds)
	if !d.LastReplacement.IsZero() {
		p.Status.LastReplacementTime = &metav1.Time{Time: d.LastReplacement}
	}
	ps.healed = len(d.Replace) > 0
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHealing, Status: d.Status, Reason: d.Reason, Message: d.Message, ObservedGeneration: p.Generation,
	})
	if !d.Wake.IsZero() {
		ps.wake(d.Wake)
	}
	replace := map[string]bool{}
	for _, n := range d.Replace {
		replace[n] = true
	}
	out := make([]poolMember, len(members))
	for i, m := range members {
		if replace[m.Name] {
			m.Updated = false
		}
		out[i] = m
	}
	return out
}
