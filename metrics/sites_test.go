package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

type fakeCooldowns struct {
	cs  []pool.Cooldown
	err error
}

func (f fakeCooldowns) ListCooldowns(context.Context) ([]pool.Cooldown, error) { return f.cs, f.err }

func TestSiteCooldownsKeepTheTopSitesAndSumTheRest(t *testing.T) {
	until := time.Now().Add(time.Minute)
	cd := func(member, site string, r rotation.Result) pool.Cooldown {
		return pool.Cooldown{Member: member, Target: site, Until: until, Reason: r}
	}
	src := fakeCooldowns{cs: []pool.Cooldown{
		cd("a", "shop.com", rotation.ResultBanned), cd("b", "shop.com", rotation.ResultBanned), cd("c", "shop.com", rotation.ResultRateLimited),
		cd("a", "news.com", rotation.ResultRateLimited), cd("b", "news.com", rotation.ResultRateLimited),
		cd("a", "blog.com", rotation.ResultBanned), cd("a", "wiki.com", rotation.ResultTargetUnreachable),
		cd("c", "", rotation.ResultUpstreamFailed),
	}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewSiteCooldownCollector(src, 3))
	want := `
# HELP proxyfleet_site_cooldowns Running cooldowns by target site and the result that set them (rate_limited, banned, target_unreachable, upstream_failed), for the sites with the most; the rest are summed as site="(other)", a member's cooldown of every site is site="*".
# TYPE proxyfleet_site_cooldowns gauge
proxyfleet_site_cooldowns{reason="banned",site="(other)"} 1
proxyfleet_site_cooldowns{reason="target_unreachable",site="(other)"} 1
proxyfleet_site_cooldowns{reason="upstream_failed",site="*"} 1
proxyfleet_site_cooldowns{reason="banned",site="shop.com"} 2
proxyfleet_site_cooldowns{reason="rate_limited",site="shop.com"} 1
proxyfleet_site_cooldowns{reason="rate_limited",site="news.com"} 2
`
	// Top 3 by count: shop.com (3), news.com (2), then "*", blog.com and
	// wiki.com tie at 1 and "*" sorts first.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_site_cooldowns"); err != nil {
		t.Fatal(err)
	}
}

func TestSiteCooldownsExportNothingWhenTheStoreCannotBeRead(t *testing.T) {
	c := NewSiteCooldownCollector(fakeCooldowns{err: errors.New("redis down")}, 0)
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("%d series from a failed read", n)
	}
}
