package gateway

import (
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/pool"
)

// allowance is the leasing stage's part that keeps a token client
// (--auth-token-file) to what its line lets it use: its acquires are
// narrowed to its scopes (pool.AcquireWithin, as the controller's tenancy
// narrows a namespace's), and a selector or pin that reaches only members
// outside them is refused with pool.NotShared, the 403 tenancy answers
// (the gateway's pool_forbidden). Requests of no token client (no
// --auth-token-file) and of an all client lease from the whole pool.
type allowance struct {
	by      map[string]*clients.Client
	members func(context.Context) ([]pool.MemberStatus, error) // nil: the pool lists none
}

func newAllowance(cs []clients.Client, p pool.Pool) allowance {
	a := allowance{by: make(map[string]*clients.Client, len(cs)), members: membersOf(p)}
	for i := range cs {
		a.by[cs[i].Name] = &cs[i]
	}
	return a
}

// membersOf is how the refusal lists p's members to name what a client
// may not use: the stores' and a lease API client's lists.
func membersOf(p pool.Pool) func(context.Context) ([]pool.MemberStatus, error) {
	switch l := p.(type) {
	case interface {
		ListMembers(context.Context) ([]pool.MemberStatus, error)
	}:
		return l.ListMembers
	case interface {
		Members(context.Context) ([]pool.MemberStatus, error)
	}:
		return l.Members
	case interface{ Members() []pool.MemberStatus }:
		return func(context.Context) ([]pool.MemberStatus, error) { return l.Members(), nil }
	}
	return nil
}

// acquire leases for req on behalf of the token client named client.
func (a allowance) acquire(ctx context.Context, p pool.Pool, client string, req pool.AcquireRequest) (pool.Lease, error) {
	c := a.by[client]
	if c == nil || c.All {
		return p.Acquire(ctx, req)
	}
	l, err := pool.AcquireWithin(ctx, p.Acquire, req, c.Selectors())
	var nm *pool.NoMatchError
	if !errors.As(err, &nm) || nm.Considered > 0 {
		return l, err
	}
	// Nothing the client may use matched: never a silent empty pool when
	// what matched is outside its allowance.
	if others := a.outside(ctx, c, req); len(others) > 0 {
		return pool.Lease{}, pool.NotShared("client "+c.Name, others,
			"not in client "+c.Name+"'s allowance ("+c.Allowance()+", --auth-token-file line "+strconv.Itoa(c.Line)+"; docs/tenancy.md#token-clients)")
	}
	return l, err
}

// outside names, sorted and distinct, the parts of the pool that match req
// and that c may not use: a controller's pool or namespace when the member
// carries them, else the member. Nil when the pool cannot be listed.
func (a allowance) outside(ctx context.Context, c *clients.Client, req pool.AcquireRequest) []string {
	if a.members == nil {
		return nil
	}
	ms, err := a.members(ctx)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if req.Proxy != "" && m.Name != req.Proxy {
			continue
		}
		if !hasAttrs(m.Attributes, req.Selector) || c.Covers(m.Attributes) {
			continue
		}
		seen[partOf(m.Member)] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// partOf is how a refusal names m: "pool NS/NAME", "Proxies of namespace
// NS in no pool" (the controller's tenancy's words), or "member NAME".
func partOf(m pool.Member) string {
	ns, p := m.Attributes[pool.AttributeNamespace], m.Attributes[pool.AttributePool]
	switch {
	case ns != "" && p != "":
		return "pool " + ns + "/" + p
	case ns != "":
		return "Proxies of namespace " + ns + " in no pool"
	}
	return "member " + m.Name
}

func hasAttrs(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
