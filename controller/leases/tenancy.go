package leases

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/pool"
)

// Attributes the controller sets on every member, over whatever a Proxy's
// spec.attributes says, so that a selector may name them and nobody can
// pretend a Proxy is someone else's: the namespace that owns the Proxy, and
// the ProxyPool it belongs to (absent for a Proxy of no pool). Tenancy
// narrows a pod's lease requests with them.
const (
	AttributeNamespace = v1alpha1.AttributeNamespace
	AttributePool      = v1alpha1.LabelPool
)

// Tenancy modes (Options.Tenancy, --lease-api-tenancy).
const (
	// TenancyNamespaced: a pod identity from namespace N leases only
	// Proxies of N, plus those a ProxyGrant shares with N. The default.
	TenancyNamespaced = "namespaced"
	// TenancyClusterWide: every pod identity the token review lets in may
	// lease every namespace's Proxies, as before tenancy; for migrating an
	// installation, and said loudly in the log.
	TenancyClusterWide = "cluster-wide"
)

// scope is a part of the fleet by namespace and pool. As what a client may
// lease from it is every Proxy of a namespace (pool "") or the Proxies of
// one pool of it; as where a member comes from (its owner) pool "" is a
// Proxy of no pool, which only a whole-namespace scope covers.
type scope struct {
	ns, pool string
}

// compareScopes orders scopes by namespace, then pool: the order refusals
// and scope lists are written in.
func compareScopes(a, b scope) int {
	if c := strings.Compare(a.ns, b.ns); c != 0 {
		return c
	}
	return strings.Compare(a.pool, b.pool)
}

func (s scope) String() string {
	if s.pool == "" {
		return "namespace " + s.ns
	}
	return "pool " + s.ns + "/" + s.pool
}

// covers reports whether a member of namespace ns and pool p is in s.
func (s scope) covers(ns, p string) bool {
	return s.ns == ns && (s.pool == "" || s.pool == p)
}

// selector is s as selector pairs over the controller's member attributes.
func (s scope) selector() map[string]string {
	if s.pool == "" {
		return map[string]string{AttributeNamespace: s.ns}
	}
	return map[string]string{AttributeNamespace: s.ns, AttributePool: s.pool}
}

// scopesOf is what namespace ns may lease, given the grants of the whole
// fleet: its own namespace first, then what grants share with it, sorted,
// with a pool's scope dropped where its whole namespace is shared. Own
// egress comes first on purpose: a team that has its own Proxies uses
// them before it borrows anyone's.
func scopesOf(ns string, grants []v1alpha1.ProxyGrant) []scope {
	whole := map[string]bool{ns: true}
	pools := map[scope]bool{}
	for i := range grants {
		g := &grants[i]
		if g.Namespace == ns || !g.DeletionTimestamp.IsZero() || !g.SharesWith(ns) {
			continue
		}
		if len(g.Spec.Pools) == 0 {
			whole[g.Namespace] = true
			continue
		}
		for _, p := range g.Spec.Pools {
			pools[scope{g.Namespace, p}] = true
		}
	}
	out := []scope{{ns: ns}}
	var rest []scope
	for n := range whole {
		if n != ns {
			rest = append(rest, scope{ns: n})
		}
	}
	for s := range pools {
		if !whole[s.ns] {
			rest = append(rest, s)
		}
	}
	slices.SortFunc(rest, compareScopes)
	return append(out, rest...)
}

// owners is the Source's view of who owns each member, by member name,
// with the attributes a selector matches; replaced whole on every rebuild.
type owners struct {
	by    map[string]scope
	attrs map[string]map[string]string
}

// tenantStore is the lease store as a pod identity sees it under namespaced
// tenancy: an acquire is narrowed to the client's scopes (own namespace
// first, then what grants share), a pin or a selector that reaches only
// Proxies it may not use is refused with pool.ErrForbidden naming them,
// and the member list shows only what it may lease. A caller with no
// identity (the static token) sees the whole store, as before.
type tenantStore struct {
	pool.LeaseStore
	grants client.Reader
	owners *atomic.Pointer[owners]
}

// ownersNow is the Source's latest view (empty before its first rebuild,
// which the server waits for anyway).
func (t tenantStore) ownersNow() *owners {
	if o := t.owners.Load(); o != nil {
		return o
	}
	return &owners{}
}

// scopes lists what c may lease from the grants in the cache.
func (t tenantStore) scopes(ctx context.Context, c pool.Client) ([]scope, error) {
	var list v1alpha1.ProxyGrantList
	if err := t.grants.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ProxyGrants from the cache: %w", err)
	}
	return scopesOf(c.Namespace, list.Items), nil
}

// Acquire leases from the first of the client's scopes that has a usable
// member; a refusal adds up every scope's counts.
func (t tenantStore) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	c := pool.ClientFrom(ctx)
	if c.Namespace == "" {
		return t.LeaseStore.Acquire(ctx, req)
	}
	scopes, err := t.scopes(ctx, c)
	if err != nil {
		return pool.Lease{}, err
	}
	own := t.ownersNow()
	if req.Proxy != "" {
		if o, ok := own.by[req.Proxy]; ok && !anyCovers(scopes, o) {
			return pool.Lease{}, notShared(c, []scope{o})
		}
		return t.LeaseStore.Acquire(ctx, req)
	}
	sels := make([]map[string]string, len(scopes))
	for i, s := range scopes {
		sels[i] = s.selector()
	}
	l, err := pool.AcquireWithin(ctx, t.LeaseStore.Acquire, req, sels)
	var refused *pool.NoMatchError
	if !errors.As(err, &refused) {
		return l, err
	}
	if refused.Considered == 0 {
		// Nothing the client may use matched: never a silent empty pool
		// when what matched is someone else's.
		if others := matchingOwners(own, req.Selector, scopes); len(others) > 0 {
			return pool.Lease{}, notShared(c, others)
		}
	}
	return pool.Lease{}, refused
}

// ListMembers is the store's list, less the members c may not lease: a
// --lease-api gateway keeps it as its last-known pool, so it must hold
// nothing its own leases could not.
func (t tenantStore) ListMembers(ctx context.Context) ([]pool.MemberStatus, error) {
	ms, err := t.LeaseStore.ListMembers(ctx)
	c := pool.ClientFrom(ctx)
	if err != nil || c.Namespace == "" {
		return ms, err
	}
	scopes, err := t.scopes(ctx, c)
	if err != nil {
		return nil, err
	}
	own := t.ownersNow()
	out := ms[:0:0]
	for _, m := range ms {
		if o, ok := own.by[m.Name]; ok && anyCovers(scopes, o) {
			out = append(out, m)
		}
	}
	return out, nil
}

func anyCovers(scopes []scope, o scope) bool {
	for _, s := range scopes {
		if s.covers(o.ns, o.pool) {
			return true
		}
	}
	return false
}

// matchingOwners are the owners, sorted and distinct, of the members sel
// matches that no scope covers.
func matchingOwners(own *owners, sel map[string]string, scopes []scope) []scope {
	seen := map[scope]bool{}
	for name, o := range own.by {
		if seen[o] || anyCovers(scopes, o) || !pool.MatchSelector(own.attrs[name], sel) {
			continue
		}
		seen[o] = true
	}
	out := slices.Collect(maps.Keys(seen))
	slices.SortFunc(out, compareScopes)
	return out
}

// notShared is the 403 for c asking for the members of others: it names
// the client's namespace, the pools (or namespaces, for Proxies of no
// pool) and what their owner must write.
func notShared(c pool.Client, others []scope) error {
	names := make([]string, 0, len(others))
	for _, o := range others {
		if o.pool == "" {
			names = append(names, "Proxies of namespace "+o.ns+" in no pool")
		} else {
			names = append(names, "pool "+o.ns+"/"+o.pool)
		}
	}
	return pool.NotShared("namespace "+c.Namespace+" ("+c.String()+")", names,
		"not shared with namespace "+c.Namespace+"; the owner shares it with a ProxyGrant in its own namespace (docs/tenancy.md)")
}
