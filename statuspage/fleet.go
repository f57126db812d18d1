package statuspage

import (
	"slices"
	"strings"
	"time"
)

// Proxy is one Proxy object as the controller page shows it.
type Proxy struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Mode      string `json:"mode"`
	// Provider is spec.provider ("" for External Proxies).
	Provider string `json:"provider"`
	// Address is host:port (status.ip and the port); "" until known.
	Address       string `json:"address"`
	LatencyMillis int64  `json:"latencyMillis"`
	// Pool is the ProxyPool the Proxy belongs to ("" for none).
	Pool      string    `json:"pool"`
	CreatedAt time.Time `json:"createdAt"`
	// AgeSeconds is how long ago the Proxy was created.
	AgeSeconds int64 `json:"ageSeconds"`
	// Message is the reason a Proxy is not Ready (a condition's message), else "".
	Message string `json:"message"`
}

// Pool is one ProxyPool.
type Pool struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Desired is status.desiredReplicas (spec.replicas as the autoscaler set it).
	Desired  int32 `json:"desired"`
	Current  int32 `json:"current"`
	Ready    int32 `json:"ready"`
	Draining int32 `json:"draining"`
}

// Provider is one ProviderHealth.
type Provider struct {
	Name         string           `json:"name"`
	Type         string           `json:"type"`
	Ready        bool             `json:"ready"`
	TargetsReady string           `json:"targetsReady"`
	LastCheck    *time.Time       `json:"lastCheck"`
	Targets      []ProviderTarget `json:"targets"`
}

// ProviderTarget is one checked target of a provider.
type ProviderTarget struct {
	Name    string `json:"name"`
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// FleetView is the controller page's JSON.
type FleetView struct {
	Kind           string    `json:"kind"`
	GeneratedAt    time.Time `json:"generatedAt"`
	RefreshSeconds int       `json:"refreshSeconds"`
	// Namespace is --proxy-namespace ("" for all namespaces).
	Namespace string `json:"namespace"`
	// Phases counts Proxies by phase (a Proxy not yet reconciled is "Pending").
	Phases    map[string]int `json:"phases"`
	Proxies   []Proxy        `json:"proxies"`
	Pools     []Pool         `json:"pools"`
	Providers []Provider     `json:"providers"`
	// LeaseStore is false when the lease API is off; Members, ActiveLeases
	// and Cooldowns are then empty.
	LeaseStore   bool     `json:"leaseStore"`
	Members      []Member `json:"members"`
	ActiveLeases int      `json:"activeLeases"`
	// Cooldowns are the {member, site} rows, the worst sites' first, at
	// most 500 (CooldownsTotal counts them all); CooldownSites groups them.
	Cooldowns      []Cooldown      `json:"cooldowns"`
	CooldownsTotal int             `json:"cooldownsTotal"`
	CooldownSites  []SiteCooldowns `json:"cooldownSites"`
	// LeaseRequests are the lease API's requests by outcome.
	LeaseRequests Chart    `json:"leaseRequests"`
	Errors        []string `json:"errors"`
}

// FleetInput is everything the controller page is made of. Rows may come
// in any order; errors are fixed phrases.
type FleetInput struct {
	Namespace     string
	Proxies       []Proxy
	Pools         []Pool
	Providers     []Provider
	LeaseStore    bool
	Pool          PoolSnapshot
	LeaseRequests Chart
	Errors        []string
}

// Fleet builds the controller page's view at now.
func Fleet(in FleetInput, now time.Time) FleetView {
	v := FleetView{
		Kind: KindController, GeneratedAt: now.UTC(), RefreshSeconds: RefreshSeconds, Namespace: in.Namespace,
		Phases: map[string]int{}, Proxies: slices.Clone(in.Proxies), Pools: slices.Clone(in.Pools),
		Providers: slices.Clone(in.Providers), LeaseStore: in.LeaseStore,
		Members:       Members(in.Pool.Members),
		LeaseRequests: in.LeaseRequests, Errors: append([]string{}, in.Errors...),
	}
	v.Cooldowns, v.CooldownsTotal, v.CooldownSites = cooldownRows(in.Pool.Cooldowns, now)
	if v.Proxies == nil {
		v.Proxies = []Proxy{}
	}
	if v.Pools == nil {
		v.Pools = []Pool{}
	}
	if v.Providers == nil {
		v.Providers = []Provider{}
	}
	for i := range v.Proxies {
		p := &v.Proxies[i]
		if p.Phase == "" {
			p.Phase = "Pending"
		}
		p.AgeSeconds = max(int64(now.Sub(p.CreatedAt)/time.Second), 0)
		v.Phases[p.Phase]++
	}
	for _, m := range v.Members {
		v.ActiveLeases += m.ActiveLeases
	}
	slices.SortFunc(v.Proxies, func(a, b Proxy) int {
		if c := strings.Compare(phaseRank(a.Phase), phaseRank(b.Phase)); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(v.Pools, func(a, b Pool) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(v.Providers, func(a, b Provider) int { return strings.Compare(a.Name, b.Name) })
	if in.Pool.Err != "" {
		v.Errors = append(v.Errors, in.Pool.Err)
	}
	return v
}

// phaseRank orders Proxies by phase, the ones needing attention first.
func phaseRank(phase string) string {
	switch phase {
	case "Failed":
		return "0"
	case "Unhealthy":
		return "1"
	case "Provisioning", "Pending":
		return "2"
	case "Deleting":
		return "3"
	case "Ready":
		return "4"
	}
	return "5" + phase
}
