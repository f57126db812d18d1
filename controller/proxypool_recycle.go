package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/pool"
)

// BanSource is the lease store's record of bans as the ProxyPool reconciler
// reads it to recycle burnt Proxies (spec.recycle). The lease API
// (controller/leases.API) implements it over either store.
type BanSource interface {
	// RecentBans lists the ban and rate-limit cooldowns per {member, site}
	// that ran within the last window (pool.Store.RecentBans).
	RecentBans(ctx context.Context, window time.Duration) ([]pool.Cooldown, error)
}

// RecycleRecorder counts recycled Proxies; metrics.PoolRecycles implements it.
type RecycleRecorder interface {
	// Recycled records one Proxy of pool namespace/name drained to recycle it.
	Recycled(namespace, pool string)
}

// recycleMember is one pool member as the recycling rule sees it.
type recycleMember struct {
	// Name is the Proxy's name.
	Name string
	// Sites are the distinct sites that had it in ban or rate-limit
	// cooldown within the window, sorted.
	Sites []string
}

// recycleDecision is the recycling rule's verdict.
type recycleDecision struct {
	// Replace names the members to recycle, with the sites that banned each.
	Replace map[string][]string
	// Status, Reason and Message are the Recycling condition's.
	Status          metav1.ConditionStatus
	Reason, Message string
}

// decideRecycle picks the members banned by at least bannedSites distinct
// sites within window (all of them: planPool paces the replacements within
// maxSurge and maxUnavailable, as for a template change).
func decideRecycle(bannedSites int, window time.Duration, members []recycleMember) recycleDecision {
	d := recycleDecision{Replace: map[string][]string{}}
	var burnt []recycleMember
	most := recycleMember{}
	for _, m := range members {
		if len(m.Sites) >= bannedSites {
			d.Replace[m.Name] = m.Sites
			burnt = append(burnt, m)
		} else if len(m.Sites) > len(most.Sites) {
			most = m
		}
	}
	if len(burnt) > 0 {
		parts := make([]string, 0, 3)
		for _, m := range burnt[:min(len(burnt), 3)] {
			parts = append(parts, m.Name+" by "+sitesList(m.Sites))
		}
		if len(burnt) > 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(burnt)-3))
		}
		d.Status, d.Reason = metav1.ConditionTrue, v1alpha1.ReasonRecyclingBanned
		d.Message = fmt.Sprintf("recycling %d Proxies banned or rate-limited by %d or more sites within %s: %s",
			len(burnt), bannedSites, window, strings.Join(parts, "; "))
		return d
	}
	d.Status, d.Reason = metav1.ConditionFalse, v1alpha1.ReasonNoneBanned
	d.Message = fmt.Sprintf("no Proxy was banned or rate-limited by %d or more sites within %s", bannedSites, window)
	if len(most.Sites) > 0 {
		d.Message += fmt.Sprintf("; the most: %s by %s", most.Name, sitesList(most.Sites))
	}
	return d
}

// sitesList names up to five sites and counts the rest.
func sitesList(sites []string) string {
	s := fmt.Sprintf("%d sites (%s", len(sites), strings.Join(sites[:min(len(sites), 5)], ", "))
	if len(sites) > 5 {
		s += ", ..."
	}
	return s + ")"
}

// bannedSites groups the lease store's bans by Proxy name: the distinct
// sites per member of namespace ns, sorted.
func bannedSites(bans []pool.Cooldown, ns string) map[string][]string {
	out := map[string][]string{}
	for _, b := range bans {
		name, ok := strings.CutPrefix(b.Member, ns+"/")
		if !ok || b.Target == "" || !b.Reason.IsBan() {
			continue
		}
		if !slices.Contains(out[name], b.Target) {
			out[name] = append(out[name], b.Target)
		}
	}
	for _, s := range out {
		slices.Sort(s)
	}
	return out
}

// recycle decides which members this pass recycles (spec.recycle), stages
// the Recycling condition and asks for the next look at the bans (they make
// no Kubernetes events). The members it returns have those to recycle
// marked not Updated, so planPool replaces them as it rolls a template:
// the replacement first within maxSurge, then the old one drained.
func (r *ProxyPoolReconciler) recycle(ctx context.Context, ps *poolPass, members []poolMember) []poolMember {
	p := ps.pool
	window := p.RecycleWindow()
	if window <= 0 {
		meta.RemoveStatusCondition(&p.Status.Conditions, v1alpha1.ConditionRecycling)
		return members
	}
	if r.Bans == nil {
		setPoolCondition(p, v1alpha1.ConditionRecycling, metav1.ConditionFalse, v1alpha1.ReasonNoBanSource,
			"the controller serves no lease API (--lease-api-listen 0), so it has no record of bans; nothing is recycled")
		return members
	}
	ps.wake(ps.now.Add(r.Intervals.Recycle))
	bans, err := r.Bans.RecentBans(ctx, window)
	if err != nil {
		setPoolCondition(p, v1alpha1.ConditionRecycling, metav1.ConditionUnknown, v1alpha1.ReasonBanSourceUnavailable,
			"reading the bans from the lease store failed, so nothing is recycled until it answers: "+err.Error())
		return members
	}
	sites := bannedSites(bans, p.Namespace)
	in := make([]recycleMember, 0, len(members))
	for _, m := range members {
		in = append(in, recycleMember{Name: m.Name, Sites: sites[m.Name]})
	}
	d := decideRecycle(int(p.Spec.Recycle.BannedSites), window, in)
	if d.Reason == v1alpha1.ReasonNoneBanned {
		// A recycle is under way until the burnt Proxy's drain ends.
		if name, note, n := ps.drainingRecycled(); n > 0 {
			d.Status, d.Reason = metav1.ConditionTrue, v1alpha1.ReasonRecyclingBanned
			d.Message = fmt.Sprintf("draining %d recycled Proxies (%s: %s); %s", n, name, note, d.Message)
		}
	}
	setPoolCondition(p, v1alpha1.ConditionRecycling, d.Status, d.Reason, d.Message)
	ps.recycling = d.Replace
	out := make([]poolMember, len(members))
	for i, m := range members {
		if _, ok := d.Replace[m.Name]; ok {
			m.Updated = false
		}
		out[i] = m
	}
	return out
}

// drainingRecycled counts the pool's Proxies still draining after a
// recycle, and names the first with its annotation.
func (ps *poolPass) drainingRecycled() (name, note string, n int) {
	for i := range ps.proxies {
		px := &ps.proxies[i]
		if v, ok := px.Annotations[v1alpha1.AnnotationRecycled]; ok && px.IsDraining() && px.DeletionTimestamp.IsZero() {
			if n == 0 {
				name, note = px.Name, v
			}
			n++
		}
	}
	return name, note, n
}

// recycleNote is the proxyfleet.io/recycled annotation of a member this
// pass drains to recycle it, written with the draining one in one patch;
// false for any other member.
func (ps *poolPass) recycleNote(name string) (string, bool) {
	sites, ok := ps.recycling[name]
	if !ok {
		return "", false
	}
	return fmt.Sprintf("banned or rate-limited by %s within %s (%d or more recycle a Proxy)",
		sitesList(sites), ps.pool.RecycleWindow(), ps.pool.Spec.Recycle.BannedSites), true
}

// countRecycle records one recycle that began: the count and time in
// status, and the metric.
func (r *ProxyPoolReconciler) countRecycle(ps *poolPass) {
	ps.pool.Status.RecycledReplicas++
	ps.pool.Status.LastRecycleTime = &metav1.Time{Time: ps.now}
	if r.Recycles != nil {
		r.Recycles.Recycled(ps.pool.Namespace, ps.pool.Name)
	}
}
