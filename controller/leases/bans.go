package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// recentBanner is a lease store that can list recent bans: the in-memory
// pool.Store and the Redis store both are.
type recentBanner interface {
	RecentBans(ctx context.Context, window time.Duration) ([]pool.Cooldown, error)
}

// RecentBans lists the store's ban and rate-limit cooldowns per {member,
// site} that ran within the last window (pool.Store.RecentBans); the
// ProxyPool reconciler reads it to recycle Proxies many sites banned. A
// store without the query is an error saying so, never an empty list.
func (a *API) RecentBans(ctx context.Context, window time.Duration) ([]pool.Cooldown, error) {
	rb, ok := a.store.(recentBanner)
	if !ok {
		return nil, fmt.Errorf("the lease store (%T) keeps no record of recent bans", a.store)
	}
	return rb.RecentBans(ctx, window)
}
