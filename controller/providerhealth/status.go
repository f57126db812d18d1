package providerhealth

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

// Reasons of the Ready condition this package sets itself; a not-ready
// provider otherwise carries the reason of its first failing target.
const (
	// ReasonAllTargetsReady: every target passed the latest check.
	ReasonAllTargetsReady = "AllTargetsReady"
	// ReasonNoTargets: the check reported no target at all, so nothing
	// shows that the backend is usable.
	ReasonNoTargets = "NoTargets"
	// ReasonTargetNotReady stands in for a failing target whose own reason
	// is not a valid condition reason.
	ReasonTargetNotReady = "TargetNotReady"
	// ReasonTimeout is a target's reason when its check did not return in
	// time.
	ReasonTimeout = "Timeout"
)

// maxConditionMessage is metav1.Condition's message limit.
const maxConditionMessage = 32768

// conditionReason is metav1.Condition's reason syntax.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// Result is one provider's latest check, as the monitor keeps it for the
// gauges and turns it into a ProviderHealth status.
type Result struct {
	// Provider is the entry name from the providers config.
	Provider string
	// Type is the entry's provider type (kubernetes, gcp, kvm).
	Type string
	// Targets are the verdicts, sorted by target name, names unique.
	Targets []providers.TargetStatus
	// Duration is how long the check took (the timeout when it did not return).
	Duration time.Duration
	// CheckedAt is when the check finished.
	CheckedAt time.Time
}

// Ready is true when the check reported targets and every one is ready.
func (r Result) Ready() bool {
	if len(r.Targets) == 0 {
		return false
	}
	for _, t := range r.Targets {
		if !t.Ready {
			return false
		}
	}
	return true
}

// readyCount is the number of ready targets.
func (r Result) readyCount() int {
	n := 0
	for _, t := range r.Targets {
		if t.Ready {
			n++
		}
	}
	return n
}

// normalizeTargets sorts the verdicts by target name and makes the names
// usable as list-map keys: an empty name becomes "unnamed", and a repeated
// name keeps its first verdict only (the API server would refuse duplicates).
func normalizeTargets(in []providers.TargetStatus) []providers.TargetStatus {
	seen := make(map[string]bool, len(in))
	out := make([]providers.TargetStatus, 0, len(in))
	for _, t := range in {
		if t.Target == "" {
			t.Target = "unnamed"
		}
		if seen[t.Target] {
			continue
		}
		seen[t.Target] = true
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}

// buildStatus turns a check result into the ProviderHealth status to write,
// given the status the object has now. A target keeps its
// lastTransitionTime when its verdict did not flip, and so does the Ready
// condition; anything that flipped gets now. generation is the object's
// metadata.generation, recorded in the condition.
func buildStatus(prev v1alpha1.ProviderHealthStatus, r Result, generation int64, now time.Time) v1alpha1.ProviderHealthStatus {
	before := make(map[string]v1alpha1.ProviderTarget, len(prev.Targets))
	for _, t := range prev.Targets {
		before[t.Name] = t
	}
	ts := metav1.NewTime(now)
	st := v1alpha1.ProviderHealthStatus{
		Type:          r.Type,
		Ready:         r.Ready(),
		TargetsReady:  fmt.Sprintf("%d/%d", r.readyCount(), len(r.Targets)),
		LastCheckTime: ptr.To(metav1.NewTime(r.CheckedAt)),
	}
	for _, t := range r.Targets {
		pt := v1alpha1.ProviderTarget{
			Name: t.Target, Ready: t.Ready, Reason: t.Reason, Message: t.Message,
			Details: copyDetails(t.Details), LastTransitionTime: ts,
		}
		if old, ok := before[t.Target]; ok && old.Ready == t.Ready && !old.LastTransitionTime.IsZero() {
			pt.LastTransitionTime = old.LastTransitionTime
		}
		st.Targets = append(st.Targets, pt)
	}
	st.Conditions = append([]metav1.Condition(nil), prev.Conditions...)
	cond := metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		ObservedGeneration: generation, LastTransitionTime: ts,
	}
	cond.Reason, cond.Message = readyReason(r)
	if st.Ready {
		cond.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return st
}

// readyReason is the Ready condition's reason and message for r.
func readyReason(r Result) (reason, message string) {
	if len(r.Targets) == 0 {
		return ReasonNoTargets, "the check reported no targets"
	}
	if r.Ready() {
		return ReasonAllTargetsReady, fmt.Sprintf("all %d targets ready", len(r.Targets))
	}
	var parts []string
	for _, t := range r.Targets {
		if t.Ready {
			continue
		}
		if reason == "" {
			reason = t.Reason
			if len(reason) > 1024 || !conditionReason.MatchString(reason) {
				reason = ReasonTargetNotReady
			}
		}
		part := t.Target + ": " + t.Reason
		if t.Message != "" {
			part += ": " + t.Message
		}
		parts = append(parts, part)
	}
	message = fmt.Sprintf("%d/%d targets ready; %s", r.readyCount(), len(r.Targets), strings.Join(parts, "; "))
	if len(message) > maxConditionMessage {
		message = strings.ToValidUTF8(message[:maxConditionMessage-3], "") + "..."
	}
	return reason, message
}

func copyDetails(d map[string]string) map[string]string {
	if len(d) == 0 {
		return nil
	}
	out := make(map[string]string, len(d))
	for k, v := range d {
		out[k] = v
	}
	return out
}
