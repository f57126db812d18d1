package metrics

import (
	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"

	"github.com/proxyfleet/proxyfleet/statuspage"
)

// PaceLister is what the pace collector reads at every scrape: the
// gateway's paced sites, most held first (*gateway.Gateway implements it).
type PaceLister interface {
	PaceStatus() []statuspage.SitePace
}

// paceCollector exports proxyfleet_site_pace_* for the top sites of
// PaceStatus' order and sums the rest as site="(other)", so a crawl of
// thousands of paced sites costs a bounded number of series. A sum may
// fall when a site moves into the top ones; the per-site series are
// exact.
type paceCollector struct {
	src                                         PaceLister
	top                                         int
	waited, waitSeconds, refused, learnt, queue *prometheus.Desc
}

// NewSitePaceCollector returns the collector of the gateway's pacing
// metrics (DefaultTopSites when top <= 0).
func NewSitePaceCollector(src PaceLister, top int) prometheus.Collector {
	if top <= 0 {
		top = DefaultTopSites
	}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "site_pace_"+name), help, []string{"site"}, nil)
	}
	return &paceCollector{src: src, top: top,
		waited:      d("waited_total", "Requests that waited for their slot in a site's pace, for the sites most held; the rest summed as site=\"(other)\"."),
		waitSeconds: d("wait_seconds_total", "Time requests waited for their slot in a site's pace, in seconds, by site as proxyfleet_site_pace_waited_total."),
		refused:     d("refused_total", "Requests answered 503 paced (no slot within --pacing-max-wait), by site as proxyfleet_site_pace_waited_total."),
		learnt:      d("learnt_interval_seconds", "The automatic slow-down's interval per member now (0: unlimited), by site as proxyfleet_site_pace_waited_total ((other): the longest)."),
		queue:       d("queued", "Requests waiting for their slot now, by site as proxyfleet_site_pace_waited_total."),
	}
}

// Describe implements prometheus.Collector.
func (c *paceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.waited, c.waitSeconds, c.refused, c.learnt, c.queue} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *paceCollector) Collect(ch chan<- prometheus.Metric) {
	sites := c.src.PaceStatus()
	var other statuspage.SitePace
	emit := func(p statuspage.SitePace, site string) {
		ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, float64(p.Waited), site)
		ch <- prometheus.MustNewConstMetric(c.waitSeconds, prometheus.CounterValue, p.WaitedSeconds, site)
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(p.Refused), site)
		ch <- prometheus.MustNewConstMetric(c.learnt, prometheus.GaugeValue, float64(p.LearntIntervalMillis)/1000, site)
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(p.Queued), site)
	}
	for i, p := range sites {
		if i < c.top {
			emit(p, p.Site)
			continue
		}
		other.Waited += p.Waited
		other.WaitedSeconds += p.WaitedSeconds
		other.Refused += p.Refused
		other.Queued += p.Queued
		other.LearntIntervalMillis = max(other.LearntIntervalMillis, p.LearntIntervalMillis)
	}
	if len(sites) > c.top {
		emit(other, SiteOther)
	}
}
