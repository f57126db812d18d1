package statuspage

import (
	"slices"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
)

// SiteCooldowns is one site's resting members, one row of the page's
// "Cooldowns by site". A crawl that follows dead links all day rests
// thousands of {member, site} pairs; one row per pair would bury the few
// sites that matter, so the page groups them by site, worst first.
type SiteCooldowns struct {
	// Site is the target key; SiteAll for the members that failed for
	// every site; OtherSites for the sum of the sites past the bound.
	Site string `json:"site"`
	// Members counts the members resting for the site.
	Members int `json:"members"`
	// Reasons counts them by what set their window ("" when not said).
	Reasons map[string]int `json:"reasons"`
	// Until is when the last of them ends; SecondsLeft is until then,
	// rounded up.
	Until       time.Time `json:"until"`
	SecondsLeft int64     `json:"secondsLeft"`
}

const (
	// OtherSites is SiteCooldowns.Site for the sites past MaxCooldownSites.
	OtherSites = "(other)"
	// MaxCooldownSites bounds the grouped rows.
	MaxCooldownSites = 50
	// maxCooldownRows bounds the per-pair rows a view carries (its
	// cooldowns; CooldownsTotal counts them all).
	maxCooldownRows = 500
)

// GroupCooldowns groups cooldown rows by site: every-site first, then the
// sites with the most members resting, then the longest to go, then by
// name; sites past MaxCooldownSites are summed in one OtherSites row.
func GroupCooldowns(cs []Cooldown) []SiteCooldowns {
	by := map[string]*SiteCooldowns{}
	for _, c := range cs {
		s := by[c.Site]
		if s == nil {
			s = &SiteCooldowns{Site: c.Site, Reasons: map[string]int{}}
			by[c.Site] = s
		}
		s.add(1, map[string]int{c.Reason: 1}, c.Until, c.SecondsLeft)
	}
	out := make([]SiteCooldowns, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b SiteCooldowns) int {
		switch {
		case (a.Site == SiteAll) != (b.Site == SiteAll):
			if a.Site == SiteAll {
				return -1
			}
			return 1
		case a.Members != b.Members:
			return b.Members - a.Members
		case a.SecondsLeft != b.SecondsLeft:
			return int(b.SecondsLeft - a.SecondsLeft)
		}
		return strings.Compare(a.Site, b.Site)
	})
	if len(out) <= MaxCooldownSites {
		return out
	}
	other := SiteCooldowns{Site: OtherSites, Reasons: map[string]int{}}
	for _, s := range out[MaxCooldownSites-1:] {
		other.add(s.Members, s.Reasons, s.Until, s.SecondsLeft)
	}
	return append(out[:MaxCooldownSites-1], other)
}

func (s *SiteCooldowns) add(members int, reasons map[string]int, until time.Time, left int64) {
	s.Members += members
	for r, n := range reasons {
		s.Reasons[r] += n
	}
	if until.After(s.Until) {
		s.Until, s.SecondsLeft = until, left
	}
}

// boundCooldowns keeps the rows of the sites shown first, at most
// maxCooldownRows, in GroupCooldowns' order of sites.
func boundCooldowns(cs []Cooldown, sites []SiteCooldowns) []Cooldown {
	if len(cs) <= maxCooldownRows {
		return cs
	}
	rank := make(map[string]int, len(sites))
	for i, s := range sites {
		rank[s.Site] = i
	}
	at := func(site string) int {
		if r, ok := rank[site]; ok {
			return r
		}
		return len(sites)
	}
	out := slices.Clone(cs)
	slices.SortStableFunc(out, func(a, b Cooldown) int { return at(a.Site) - at(b.Site) })
	return out[:maxCooldownRows]
}

// cooldownRows is a view's cooldowns: the bounded rows, their count, and
// the rows grouped by site.
func cooldownRows(cs []pool.Cooldown, now time.Time) ([]Cooldown, int, []SiteCooldowns) {
	rows := Cooldowns(cs, now)
	sites := GroupCooldowns(rows)
	return boundCooldowns(rows, sites), len(rows), sites
}
