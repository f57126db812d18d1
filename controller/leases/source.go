// Package leases serves the controller's lease API: the same pool.Store and
// HTTP API a standalone gateway serves, fed by the Proxy objects in the
// manager's cache instead of flags and files. Only Healthy Proxies are
// offered. Neither the source nor the server is leader-elected: every
// replica serves, but leases and cooldowns live in one process, which is why
// the controller ships as one replica.
//
// It imports api/v1alpha1, pool, pool/leaseapi, controller/credentials,
// internal/logging and internal/tracing; never the reconcilers (controller
// reads its lease counts through controller.LeaseStats) or gateway.
package leases

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/pool"
)

// MemberName is the pool member name of a Proxy, "<namespace>/<name>": unique
// across namespaces, and what a lease's "proxy" pins.
func MemberName(p *v1alpha1.Proxy) string {
	return p.Namespace + "/" + p.Name
}

// URLFunc returns the URL a Proxy is reached at, login included
// (credentials.ProxyURL over the credentials cache). An error makes the
// member unhealthy at its bare address; ErrWithheld leaves it out.
type URLFunc func(p *v1alpha1.Proxy) (*url.URL, error)

// ErrWithheld is what a URLFunc returns for a Proxy whose login must not be
// handed out (the API authenticates nobody): the member is left out rather
// than offered without the login it needs.
var ErrWithheld = errors.New("login withheld: the lease API authenticates no caller")

// Members turns Proxies into pool members with their health: every Proxy
// with an address (Address() not empty) that is not being deleted becomes a
// member at urlFor's URL (scheme and login included; nil urlFor means
// http://host:port) with spec.attributes and its owner's (ownedAttributes), healthy when its Healthy condition
// is True for the address it has now, with status.latencyMillis as its
// latency. Health belongs to an address: an External Proxy whose endpoint
// host was just edited (status.ip still the old host until the reconciler
// catches up and clears the verdict) is unhealthy until probed. A Proxy
// whose login cannot be read is an unhealthy member at its bare address. A
// Proxy with the proxyfleet.io/draining annotation is a member but never
// healthy, so it keeps its leases and gets no new ones. The result is
// sorted by name (the order the store keeps anyway).
func Members(proxies []v1alpha1.Proxy, urlFor URLFunc) []pool.MemberHealth {
	out := make([]pool.MemberHealth, 0, len(proxies))
	for i := range proxies {
		p := &proxies[i]
		addr := p.Address()
		if addr == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		u, loginOK := &url.URL{Scheme: "http", Host: addr}, true
		if urlFor != nil {
			got, err := urlFor(p)
			switch {
			case errors.Is(err, ErrWithheld):
				continue
			case err != nil || got == nil:
				loginOK = false
			default:
				u = got
			}
		}
		out = append(out, pool.MemberHealth{
			Member: pool.Member{
				Name:       MemberName(p),
				URL:        u,
				Attributes: ownedAttributes(p),
			},
			// A draining Proxy (proxyfleet.io/draining) is out of service
			// like an unhealthy one: its leases run on, no new ones come.
			Healthy: loginOK && p.IsHealthy() && p.Status.IP == p.EffectiveHost() && !p.IsDraining(),
			Latency: time.Duration(max(p.Status.LatencyMillis, 0)) * time.Millisecond,
		})
	}
	sortMembers(out)
	return out
}

// ownedAttributes is p's spec.attributes with AttributeNamespace and, for a
// Proxy of a pool, AttributePool set to where it really belongs: a Proxy's
// own attributes cannot claim another owner, so a selector naming them
// means what it says and tenancy can narrow by them.
func ownedAttributes(p *v1alpha1.Proxy) map[string]string {
	attrs := maps.Clone(p.Spec.Attributes)
	if attrs == nil {
		attrs = map[string]string{}
	}
	delete(attrs, AttributePool)
	attrs[AttributeNamespace] = p.Namespace
	if name := p.Labels[v1alpha1.LabelPool]; name != "" {
		attrs[AttributePool] = name
	}
	return attrs
}

// ownersOf is who owns each member, from the attributes ownedAttributes set.
func ownersOf(ms []pool.MemberHealth) *owners {
	o := &owners{by: make(map[string]scope, len(ms)), attrs: make(map[string]map[string]string, len(ms))}
	for _, m := range ms {
		o.by[m.Name] = scope{ns: m.Attributes[AttributeNamespace], pool: m.Attributes[AttributePool]}
		o.attrs[m.Name] = m.Attributes
	}
	return o
}

// Source keeps a pool.Store in step with the Proxies in a manager's cache.
// An informer event handler wakes it on every Proxy change; it then lists
// the cache and applies the whole member set at once (changes coalesce, and
// a missed delta cannot leave the store wrong). It is a manager Runnable
// that runs on every replica.
type Source struct {
	cache cache.Cache
	creds cache.Cache
	open  bool // the API authenticates nobody: logins are withheld
	// grants: namespaced tenancy reads ProxyGrants from cache.
	grants bool
	store  pool.LeaseStore
	log    logr.Logger

	kick   chan struct{} // capacity 1: a pending rebuild
	synced chan struct{} // closed after the first rebuild
	last   []pool.MemberHealth
	// owners is who owns each member now, for tenancy (tenantStore).
	owners atomic.Pointer[owners]
}

// sourceOptions configure newSource.
type sourceOptions struct {
	// Credentials is the controller's credentials Secret cache: member URLs
	// carry the logins it holds, and its Secret events rebuild the members.
	Credentials cache.Cache
	// WithholdLogins leaves out every Proxy that has a login: set when the
	// API runs without a token, since only authenticated callers may be
	// handed a login.
	WithholdLogins bool
	// Grants starts the ProxyGrant informer with the Proxies' and waits
	// for it, so that namespaced tenancy reads every grant from the first
	// request on.
	Grants bool
}

// newSource returns a source that feeds store from c's Proxies, with the
// logins in o.Credentials. It runs in the manager whose caches they are
// (API.Runnables).
func newSource(c cache.Cache, store pool.LeaseStore, log logr.Logger, o sourceOptions) *Source {
	return &Source{
		cache:  c,
		creds:  o.Credentials,
		open:   o.WithholdLogins,
		grants: o.Grants,
		store:  store,
		log:    log,
		kick:   make(chan struct{}, 1),
		synced: make(chan struct{}),
	}
}

// NeedLeaderElection is false: every replica serves the lease API, so every
// replica needs its members.
func (s *Source) NeedLeaderElection() bool { return false }

// Synced is closed once the store holds the cache's Proxies for the first
// time; before that an empty pool would mean "not loaded yet", not "none".
func (s *Source) Synced() <-chan struct{} { return s.synced }

// Start watches Proxies until ctx ends. It fails only when the informer
// cannot be obtained or the cache never syncs.
func (s *Source) Start(ctx context.Context) error {
	inf, err := s.cache.GetInformer(ctx, &v1alpha1.Proxy{})
	if err != nil {
		return fmt.Errorf("lease API: Proxy informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.wake() },
		UpdateFunc: func(_, _ any) { s.wake() },
		DeleteFunc: func(any) { s.wake() },
	})
	if err != nil {
		return fmt.Errorf("lease API: watching Proxies: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	// A rotated or deleted login changes the member URL: rebuild on every
	// credentials Secret event too.
	sinf, err := s.creds.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("lease API: credentials Secret informer: %w", err)
	}
	sreg, err := sinf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.wake() },
		UpdateFunc: func(_, _ any) { s.wake() },
		DeleteFunc: func(any) { s.wake() },
	})
	if err != nil {
		return fmt.Errorf("lease API: watching credentials Secrets: %w", err)
	}
	defer func() { _ = sinf.RemoveEventHandler(sreg) }()
	if s.grants {
		// Grants are read per request from the cache; their informer
		// starts here so the cache syncs them before the API answers.
		if _, err := s.cache.GetInformer(ctx, &v1alpha1.ProxyGrant{}); err != nil {
			return fmt.Errorf("lease API: ProxyGrant informer (is the proxygrants.proxyfleet.io CRD installed? docs/tenancy.md): %w", err)
		}
	}
	if !s.cache.WaitForCacheSync(ctx) || !s.creds.WaitForCacheSync(ctx) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("lease API: the Proxy or credentials cache never synced")
	}
	for {
		if err := s.sync(ctx); err != nil {
			// Only a cache list can fail, and only while stopping; keep the
			// previous members and try again on the next event.
			s.log.Error(err, "lease API: listing Proxies failed; keeping the previous members")
		} else {
			select {
			case <-s.synced:
			default:
				close(s.synced)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		}
	}
}

// wake asks for a rebuild; a rebuild already pending absorbs it.
func (s *Source) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// sync lists the Proxies from the cache and applies them to the store when
// anything a lease depends on changed.
func (s *Source) sync(ctx context.Context) error {
	var list v1alpha1.ProxyList
	if err := s.cache.List(ctx, &list); err != nil {
		return fmt.Errorf("listing Proxies from the cache: %w", err)
	}
	var withheld []string
	next := Members(list.Items, func(p *v1alpha1.Proxy) (*url.URL, error) {
		u, err := credentials.ProxyURL(ctx, s.creds, p)
		if err != nil {
			return nil, err
		}
		if s.open && u != nil && u.User != nil {
			withheld = append(withheld, MemberName(p))
			return nil, ErrWithheld
		}
		return u, nil
	})
	if sameMembers(s.last, next) {
		return nil
	}
	if len(withheld) > 0 {
		s.log.Info(AuthDisabledWarning+": Proxies with a login are not offered, since their logins go only to authenticated callers; give --lease-api-token-file",
			"withheld", logNames(withheld))
	}
	s.owners.Store(ownersOf(next))
	s.store.SetMembersHealth(next)
	added, removed, flipped := diffMembers(s.last, next)
	healthy := 0
	for _, m := range next {
		if m.Healthy {
			healthy++
		}
	}
	s.log.Info("lease API members updated", "members", len(next), "healthy", healthy,
		"added", logNames(added), "removed", logNames(removed), "healthChanged", logNames(flipped))
	s.last = next
	return nil
}

func sortMembers(ms []pool.MemberHealth) {
	slices.SortFunc(ms, func(a, b pool.MemberHealth) int { return strings.Compare(a.Name, b.Name) })
}

// maxLoggedNames bounds the names one log line lists per kind of change.
const maxLoggedNames = 10

// logNames lists up to maxLoggedNames names and how many more there are.
func logNames(names []string) []string {
	if len(names) <= maxLoggedNames {
		return names
	}
	return append(slices.Clone(names[:maxLoggedNames]), fmt.Sprintf("... %d more", len(names)-maxLoggedNames))
}

// sameMembers reports whether two sorted member lists would lease the same.
func sameMembers(a, b []pool.MemberHealth) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Name != y.Name || x.Healthy != y.Healthy || x.Latency != y.Latency ||
			x.URL.String() != y.URL.String() || !maps.Equal(x.Attributes, y.Attributes) {
			return false
		}
	}
	return true
}

// diffMembers names the members added, removed and whose health flipped
// between two sorted lists, for the log.
func diffMembers(prev, next []pool.MemberHealth) (added, removed, flipped []string) {
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		switch {
		case j == len(next) || (i < len(prev) && prev[i].Name < next[j].Name):
			removed = append(removed, prev[i].Name)
			i++
		case i == len(prev) || next[j].Name < prev[i].Name:
			added = append(added, next[j].Name)
			j++
		default:
			if prev[i].Healthy != next[j].Healthy {
				flipped = append(flipped, next[j].Name)
			}
			i++
			j++
		}
	}
	return added, removed, flipped
}
