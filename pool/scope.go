package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
)

// Narrow is sel within a scope, the members whose attributes carry every
// pair of scope: scope's pairs added to sel, or ok false when sel already
// names another value for one of scope's keys (the scope can match
// nothing of what was asked). The caller's selector is never changed.
func Narrow(sel, scope map[string]string) (map[string]string, bool) {
	out := maps.Clone(sel)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range scope {
		if have, ok := out[k]; ok && have != v {
			return nil, false
		}
		out[k] = v
	}
	return out, true
}

// AcquireWithin leases for req from the first of scopes (each a selector
// over member attributes) that has a usable member, acquire being the
// store's Acquire: a client restricted to parts of the fleet (a namespace
// and what was shared with it, a token client's allowance) asks each part
// in turn, its own first. A pin (req.Proxy) is asked within every scope
// too, so it cannot reach a member outside them. When every scope refuses,
// the answer is their refusals added up; Considered 0 then means nothing
// the client may use matched, and the caller says whether something it may
// not use did (NotShared) rather than answer an empty pool.
func AcquireWithin(ctx context.Context, acquire func(context.Context, AcquireRequest) (Lease, error), req AcquireRequest, scopes []map[string]string) (Lease, error) {
	var refused NoMatchError
	for _, s := range scopes {
		sel, ok := Narrow(req.Selector, s)
		if !ok {
			continue
		}
		r := req
		r.Selector = sel
		l, err := acquire(ctx, r)
		var nm *NoMatchError
		if !errors.As(err, &nm) {
			return l, err
		}
		refused.Add(nm)
	}
	return Lease{}, &refused
}

// maxNamedRefused bounds the parts of the fleet a refusal names.
const maxNamedRefused = 5

// NotShared is the one refusal of a client asking for egress it may not
// use, whoever restricts it (the controller's tenancy, a gateway's token
// clients): ErrForbidden (the lease API's 403 not_shared, the gateway's
// 403 pool_forbidden) naming who asked, what it asked for (up to five
// names, then how many more) and how it gets the right.
func NotShared(who string, what []string, how string) error {
	names := what
	if len(what) > maxNamedRefused {
		names = append(what[:maxNamedRefused:maxNamedRefused], fmt.Sprintf("and %d more", len(what)-maxNamedRefused))
	}
	return fmt.Errorf("%w: %s may not lease %s: %s", ErrForbidden, who, strings.Join(names, ", "), how)
}

// The member attributes the controller sets from a Proxy's namespace and
// ProxyPool (api/v1alpha1's AttributeNamespace and LabelPool, which
// controller/leases checks these against): a gateway's token client names
// a pool with them without linking the Kubernetes API types.
const (
	AttributeNamespace = "proxyfleet.io/namespace"
	AttributePool      = "proxyfleet.io/pool"
)
