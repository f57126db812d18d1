package metrics

import (
	"cmp"
	"context"
	"slices"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

	"github.com/proxyfleet/proxyfleet/pool"
)

// CooldownLister is what the site collector reads at every scrape: the
// lease store's running cooldowns (both stores implement it).
type CooldownLister interface {
	ListCooldowns(ctx context.Context) ([]pool.Cooldown, error)
}

// DefaultTopSites is how many sites get series of their own.
const DefaultTopSites = 20

// Site label values that are not a site.
const (
	// SiteAll is a member's cooldown for every site (its own failure).
	SiteAll = "*"
	// SiteOther sums the sites past the top ones.
	SiteOther = "(other)"
)

// siteCollector answers "which sites are banning us right now" without a
// series per site ever seen: a crawler visits thousands of sites, so only
// the sites with the most running cooldowns get their own series.
type siteCollector struct {
	src  CooldownLister
	top  int
	desc *prometheus.Desc
}

// NewSiteCooldownCollector returns a collector for
// proxyfleet_site_cooldowns{site,reason}: running cooldowns by target site
// and the result that set them, read from src at every scrape, for the top
// sites by count (DefaultTopSites when top <= 0; ties by name), the rest
// summed as site="(other)", every-site cooldowns as site="*". A failed read
// exports nothing.
func NewSiteCooldownCollector(src CooldownLister, top int) prometheus.Collector {
	if top <= 0 {
		top = DefaultTopSites
	}
	return &siteCollector{src: src, top: top, desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "site_cooldowns"),
		"Running cooldowns by target site and the result that set them (rate_limited, banned, target_unreachable, upstream_failed), for the sites with the most; the rest are summed as site=\"(other)\", a member's cooldown of every site is site=\"*\".",
		[]string{"site", "reason"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *siteCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *siteCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultProxyScrapeTimeout)
	defer cancel()
	cs, err := c.src.ListCooldowns(ctx)
	if err != nil {
		return
	}
	type key struct{ site, reason string }
	counts, perSite := map[key]int{}, map[string]int{}
	for _, cd := range cs {
		site := cd.Target
		if site == "" {
			site = SiteAll
		}
		counts[key{site, string(cd.Reason)}]++
		perSite[site]++
	}
	sites := make([]string, 0, len(perSite))
	for s := range perSite {
		sites = append(sites, s)
	}
	slices.SortFunc(sites, func(a, b string) int {
		return cmp.Or(cmp.Compare(perSite[b], perSite[a]), cmp.Compare(a, b))
	})
	kept := map[string]bool{}
	for _, s := range sites[:min(c.top, len(sites))] {
		kept[s] = true
	}
	out := map[key]int{}
	for k, n := range counts {
		if !kept[k.site] {
			k.site = SiteOther
		}
		out[k] += n
	}
	for k, n := range out {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.site, k.reason)
	}
}
