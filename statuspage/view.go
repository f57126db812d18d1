// Package statuspage builds the live status pages of `proxyfleet gateway` and
// `proxyfleet controller`: a view model made from what each process knows
// (pure functions, unit-tested), a read-only handler serving it as JSON and
// as one self-contained HTML page that polls the JSON, and the Timeline the
// page's chart is drawn from. It imports nothing of Kubernetes, so the
// sidecar build carries it; the controller converts its objects into the
// rows here.
//
// No secret reaches a view: member URLs lose their userinfo, query and
// fragment (SafeURL), tokens are never an input, and failures are shown
// as fixed phrases (the detail goes to the process log).
package statuspage

import (
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// Kinds of view, the JSON's "kind".
const (
	KindGateway    = "gateway"
	KindController = "controller"
)

// RefreshSeconds is how often the page polls its JSON.
const RefreshSeconds = 2

// Member is one pool member as the pages show it.
type Member struct {
	Name string `json:"name"`
	// URL is the member without credentials (SafeURL); direct members
	// show as direct:// and their source address.
	URL string `json:"url"`
	// State is "ok", "unhealthy" (the probe says so) or "failing" (out
	// for every site after an upstream failure).
	State         string            `json:"state"`
	Healthy       bool              `json:"healthy"`
	LatencyMillis int64             `json:"latencyMillis"`
	ActiveLeases  int               `json:"activeLeases"`
	Cooldowns     int               `json:"cooldowns"`
	Attributes    map[string]string `json:"attributes"`
}

// Member states.
const (
	StateOK        = "ok"
	StateUnhealthy = "unhealthy"
	StateFailing   = "failing"
)

// Cooldown is one member resting for one site.
type Cooldown struct {
	// Site is the target key; "*" means every site (the member itself failed).
	Site   string    `json:"site"`
	Member string    `json:"member"`
	Until  time.Time `json:"until"`
	// SecondsLeft is rounded up, so a running cooldown never shows 0.
	SecondsLeft int64 `json:"secondsLeft"`
	// Reason is what set the window: rate_limited, banned,
	// target_unreachable, upstream_failed; "" when the source does not say
	// (a --lease-api gateway sees no reasons).
	Reason string `json:"reason"`
}

// SiteAll is Cooldown.Site for a cooldown of every site.
const SiteAll = "*"

// PoolSnapshot is what a process read from its lease store (or lease API)
// for one page.
type PoolSnapshot struct {
	Members   []pool.MemberStatus
	Cooldowns []pool.Cooldown
	// Err is a fixed phrase saying what could not be read; the details
	// belong in the log.
	Err string
	// Outage is set while a --lease-api gateway's lease API is away; the
	// members and cooldowns are then its last-known pool's.
	Outage *Outage
	// LastKnown is a --lease-api gateway's last-known list, when it keeps one.
	LastKnown *LastKnown
	// Overrides is the gateway's latest episode of leases of members
	// resting for their own failures; nil when there was none.
	Overrides *Overrides
}

// Overrides is an episode of leases of members that rest for their own
// failures, taken because no other member could serve
// (rotation.FailureRest).
type Overrides struct {
	// Since is the episode's first such lease, Last its latest.
	Since time.Time `json:"since"`
	Last  time.Time `json:"last"`
	// Count is the leases in the episode; Member the latest one's member.
	Count  int64  `json:"count"`
	Member string `json:"member"`
	// Over: a member that does not rest served since.
	Over bool `json:"over"`
}

// overridesShown is how long after its end an override episode is still
// noted on the page.
const overridesShown = 10 * time.Minute

// LastKnown is the member list a --lease-api gateway would fall back on.
type LastKnown struct {
	// ListAt is when it arrived (zero: never); Members how many it holds.
	ListAt  time.Time `json:"listAt,omitzero"`
	Members int       `json:"members"`
}

// Outage is a --lease-api gateway's view of a lease API outage.
type Outage struct {
	// Since is when the API stopped answering; LastAnswer when it last did
	// (zero: never).
	Since      time.Time `json:"since"`
	LastAnswer time.Time `json:"lastAnswer,omitzero"`
	// ListAt is when the last-known member list arrived (zero: never).
	ListAt time.Time `json:"listAt,omitzero"`
	// GraceEnds is when the gateway stops leasing from that list.
	GraceEnds time.Time `json:"graceEnds,omitzero"`
	// Refusing: requests get 503 pool_unreachable, because no list was
	// ever received (ListAt zero) or the grace ended.
	Refusing bool `json:"refusing"`
	// Untold counts bans and failures learnt meanwhile, to tell the API.
	Untold int `json:"untold"`
}

// GatewayView is the gateway page's JSON.
type GatewayView struct {
	Kind           string    `json:"kind"`
	GeneratedAt    time.Time `json:"generatedAt"`
	RefreshSeconds int       `json:"refreshSeconds"`
	// Pool says where the members come from: "own" (the gateway's store)
	// or "pool-api" (a controller's lease API, PoolAPI).
	Pool         string   `json:"pool"`
	PoolAPI      string   `json:"poolAPI,omitempty"`
	Members      []Member `json:"members"`
	ActiveLeases int      `json:"activeLeases"`
	// Cooldowns are the {member, site} rows, the worst sites' first, at
	// most 500 (CooldownsTotal counts them all); CooldownSites groups them.
	Cooldowns      []Cooldown      `json:"cooldowns"`
	CooldownsTotal int             `json:"cooldownsTotal"`
	CooldownSites  []SiteCooldowns `json:"cooldownSites"`
	// Outage is set while the lease API (PoolAPI) is away.
	Outage *Outage `json:"outage,omitempty"`
	// LastKnown is the list the gateway falls back on during an outage.
	LastKnown *LastKnown `json:"lastKnown,omitempty"`
	// FailureRestOverrides is the latest episode of leases of members
	// resting for their own failures (shown while it runs and for
	// overridesShown after).
	FailureRestOverrides *Overrides `json:"failureRestOverrides,omitempty"`
	// Paces are the sites with a pace (explicit or learnt), most held
	// first, at most MaxPaceRows (PacesTotal counts them all).
	Paces      []SitePace `json:"paces"`
	PacesTotal int        `json:"pacesTotal"`
	// Requests are the gateway's requests by outcome.
	Requests Chart    `json:"requests"`
	Errors   []string `json:"errors"`
	Notes    []string `json:"notes"`
}

// MaxPaceRows bounds the paced sites a gateway view carries, as
// maxCooldownRows bounds its cooldowns: a crawl of 100,000 sites, each
// with a pace, made a 20 MB status.json rebuilt at every 2-second poll.
// The first ones of GatewayInput.Paces (the most held) are kept, and
// GatewayView.PacesTotal counts them all; 50 is more than a person reads
// on the page, and a script wanting every site reads the metrics.
const MaxPaceRows = 50

// GatewayInput is everything the gateway page is made of.
type GatewayInput struct {
	Pool PoolSnapshot
	// PoolAPI is the --lease-api address ("" for an own pool).
	PoolAPI  string
	Requests Chart
	// Paces are the paced sites, most held first (gateway.PaceStatus's
	// order); the view keeps the first MaxPaceRows.
	Paces []SitePace
}

// Gateway builds the gateway page's view at now.
func Gateway(in GatewayInput, now time.Time) GatewayView {
	v := GatewayView{
		Kind: KindGateway, GeneratedAt: now.UTC(), RefreshSeconds: RefreshSeconds, Pool: "own",
		Members:  Members(in.Pool.Members),
		Requests: in.Requests, Errors: []string{}, Notes: []string{}, Paces: in.Paces, PacesTotal: len(in.Paces),
	}
	if v.Paces == nil {
		v.Paces = []SitePace{}
	}
	if len(v.Paces) > MaxPaceRows {
		v.Paces = v.Paces[:MaxPaceRows:MaxPaceRows]
	}
	v.Cooldowns, v.CooldownsTotal, v.CooldownSites = cooldownRows(in.Pool.Cooldowns, now)
	for _, m := range v.Members {
		v.ActiveLeases += m.ActiveLeases
	}
	if in.PoolAPI != "" {
		v.Pool, v.PoolAPI = "pool-api", SafeURL(in.PoolAPI)
		v.Notes = append(v.Notes, "Members, leases and cooldowns are the lease API's, shared by every gateway using it; the API does not say why a cooldown runs.")
	}
	v.LastKnown = in.Pool.LastKnown
	if o := in.Pool.Outage; o != nil {
		v.Outage = o
		// A gateway on a shared lease store (Redis) rides out its store
		// as a --lease-api gateway rides out the lease API.
		who, grace := "The lease API", "--pool-outage-grace"
		if in.PoolAPI == "" {
			who, grace = "The lease store", "the outage grace"
		}
		switch {
		case o.Refusing && o.ListAt.IsZero():
			v.Errors = append(v.Errors, who+" has not answered since "+o.Since.UTC().Format(time.RFC3339)+
				" and no member list was ever received from it: requests get 503 pool_unreachable.")
		case o.Refusing:
			v.Errors = append(v.Errors, who+" has not answered since "+o.Since.UTC().Format(time.RFC3339)+
				", longer than "+grace+" after its last answer ("+o.LastAnswer.UTC().Format(time.RFC3339)+
				"): requests get 503 pool_unreachable.")
		default:
			v.Errors = append(v.Errors, who+" has not answered since "+o.Since.UTC().Format(time.RFC3339)+
				"; the gateway leases from its last-known members (listed at "+o.ListAt.UTC().Format(time.RFC3339)+
				") until "+o.GraceEnds.UTC().Format(time.RFC3339)+" ("+grace+").")
			v.Notes = append(v.Notes, "Members and cooldowns below are the gateway's last-known pool, with its own leases and what it learnt during the outage; they are told to "+strings.ToLower(who[:1])+who[1:]+" when it answers again.")
		}
	}
	if in.Pool.Err != "" {
		v.Errors = append(v.Errors, in.Pool.Err)
	}
	overrideNotes(&v, in.Pool.Overrides, now)
	return v
}

// overrideNotes says on the page that requests go to members resting for
// their own failures: an error while it lasts, a note for a while after.
func overrideNotes(v *GatewayView, o *Overrides, now time.Time) {
	if o == nil || o.Since.IsZero() || (o.Over && now.Sub(o.Last) > overridesShown) {
		return
	}
	v.FailureRestOverrides = o
	counts := strconv.FormatInt(o.Count, 10) + " leases, the latest on " + o.Member + " at " + o.Last.UTC().Format(time.RFC3339)
	if !o.Over {
		v.Errors = append(v.Errors, "Every member that could serve rests for its own failures since "+o.Since.UTC().Format(time.RFC3339)+
			": the gateway tries them anyway, least recently failed first ("+counts+"); see --max-failure-rest-percent.")
		return
	}
	v.Notes = append(v.Notes, "From "+o.Since.UTC().Format(time.RFC3339)+" every member that could serve rested for its own failures, and the gateway tried them anyway ("+counts+"); members that do not rest serve again.")
}

// Members converts store members into page rows, sorted by name.
func Members(ms []pool.MemberStatus) []Member {
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		row := Member{
			Name: m.Name, URL: memberURL(m.Member), Healthy: m.Healthy, State: StateOK,
			LatencyMillis: m.Latency.Milliseconds(), ActiveLeases: m.ActiveLeases, Cooldowns: len(m.Cooldowns),
			Attributes: maps.Clone(m.Attributes),
		}
		if row.Attributes == nil {
			row.Attributes = map[string]string{}
		}
		if _, failing := m.Cooldowns[""]; failing {
			row.State = StateFailing
		}
		if !m.Healthy {
			row.State = StateUnhealthy
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Cooldowns converts store cooldowns into page rows, sorted by site (every
// site first), then member; those ended by now are left out.
func Cooldowns(cs []pool.Cooldown, now time.Time) []Cooldown {
	out := make([]Cooldown, 0, len(cs))
	for _, c := range cs {
		left := c.Until.Sub(now)
		if left <= 0 {
			continue
		}
		site := c.Target
		if site == "" {
			site = SiteAll
		}
		out = append(out, Cooldown{
			Site: site, Member: c.Member, Until: c.Until.UTC(), Reason: string(c.Reason),
			SecondsLeft: int64((left + time.Second - 1) / time.Second),
		})
	}
	slices.SortFunc(out, func(a, b Cooldown) int {
		if c := strings.Compare(a.Site, b.Site); c != 0 {
			return c
		}
		return strings.Compare(a.Member, b.Member)
	})
	return out
}

// memberURL is m's address without credentials.
func memberURL(m pool.Member) string {
	if m.URL == nil {
		return m.Redacted() // direct://[source address]: nothing secret
	}
	return safe(m.URL)
}

// SafeURL is raw without userinfo, query or fragment: what a page may show
// of a member or API address. Unparsable input shows as "(invalid URL)",
// never as itself.
func SafeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid URL)"
	}
	return safe(u)
}

func safe(u *url.URL) string {
	c := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	return c.String()
}

// MembersFromAPI turns a lease API listing into store members for the
// page: the URL is parsed back (it is already redacted by the API), and
// cooldowns carry no reason.
func MembersFromAPI(ps []leaseapi.ProxyInfo) ([]pool.MemberStatus, []pool.Cooldown) {
	ms := make([]pool.MemberStatus, 0, len(ps))
	var cs []pool.Cooldown
	for _, p := range ps {
		m := pool.MemberStatus{
			Member:  pool.Member{Name: p.Name, Attributes: p.Attributes},
			Healthy: p.Healthy, Latency: time.Duration(p.LatencyMillis) * time.Millisecond, ActiveLeases: p.ActiveLeases,
		}
		switch u, err := url.Parse(p.URL); {
		case err == nil && u.Scheme == "direct":
			m.SourceAddr, _ = netip.ParseAddr(u.Hostname())
		case err == nil && u.Host != "":
			m.URL = u
		default:
			m.URL = &url.URL{Scheme: "invalid", Host: "invalid"}
		}
		for _, c := range p.Cooldowns {
			if m.Cooldowns == nil {
				m.Cooldowns = map[string]time.Time{}
			}
			m.Cooldowns[c.Target] = c.Until
			cs = append(cs, pool.Cooldown{Member: p.Name, Target: c.Target, Until: c.Until})
		}
		ms = append(ms, m)
	}
	return ms, cs
}
