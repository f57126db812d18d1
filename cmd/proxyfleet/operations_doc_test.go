//go:build !sidecar

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated metrics reference in docs/operations.md")

const (
	operationsDoc  = "../../docs/operations.md"
	referenceStart = "<!-- metrics reference: generated from the registries by TestOperationsMetricsReferenceMatchesTheRegistries; go test ./cmd/proxyfleet -run TestOperationsMetricsReference -update-docs rewrites it -->"
	referenceEnd   = "<!-- end of the metrics reference -->"
)

// onePool is a lease store view with one member, lease and cooldown, so
// every scrape-time gauge has a series to gather.
type onePool struct{}

func (onePool) Members() []pool.MemberStatus {
	return []pool.MemberStatus{{Member: pool.Member{Name: "a"}, Healthy: true}}
}
func (onePool) ActiveLeases() int    { return 1 }
func (onePool) ActiveCooldowns() int { return 1 }
func (onePool) ListCooldowns(context.Context) ([]pool.Cooldown, error) {
	return []pool.Cooldown{{Member: "a", Target: "shop.com", Until: time.Now().Add(time.Minute), Reason: "banned"}}, nil
}

type oneProvider struct{}

func (oneProvider) EachTarget(fn func(provider, target string, up bool, d time.Duration, at time.Time)) {
	fn("in-cluster", "apiserver", true, time.Millisecond, time.Now())
}

type onePhase struct{}

func (onePhase) ProxiesByPhase(context.Context) (map[string]int, error) {
	return map[string]int{"Ready": 1}, nil
}

type onePrice struct{}

func (onePrice) ProxyHourlyPrices(context.Context) ([]metrics.ProxyPrice, error) {
	return []metrics.ProxyPrice{{Namespace: "crawl", Name: "eu-1", Provider: "aws-eu", Price: 0.0104}}, nil
}

// gatewayMetrics and controllerMetrics register what the two commands
// register (daemon.Run; setupLeaseAPI, setupHealth, buildProviders, the
// provider health monitor and registerProxyCollector), with one event
// each so every family has a series.
func gatewayMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	reg.MustRegister(metrics.NewPoolCollector(onePool{}), metrics.NewSiteCooldownCollector(onePool{}, 0), metrics.NewSitePaceCollector(onePace{}, 0))
	m.Request("a", "ok", time.Millisecond)
	m.UpstreamFailure("a")
	m.BytesRelayed("up", 1)
	m.MITMHelloFallback("key_share")
	m.ObserveProbe("a", time.Millisecond, false)
	m.LeaseRequest("granted")
	metrics.NewLeaseStoreCalls(reg).Observe("acquire", time.Millisecond, nil)
	return reg
}

// onePace is one paced site, so the pace collector has series to gather.
type onePace struct{}

func (onePace) PaceStatus() []statuspage.SitePace {
	return []statuspage.SitePace{{Site: "shop.com", Waited: 1}}
}

// poolAPIGatewayMetrics are the series only a gateway on a remote pool (a
// --lease-api lease API or a Redis --lease-store) adds:
// its last-known pool's outage counters.
func poolAPIGatewayMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	o := metrics.NewPoolOutages(reg, func() (bool, bool) { return true, false })
	o.PoolOutage()
	o.LastKnownLease()
	return reg
}

func controllerMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	metrics.NewLeaseRequests(reg).LeaseRequest("granted")
	metrics.NewLeaseStoreCalls(reg).Observe("acquire", time.Millisecond, nil)
	metrics.NewHealthChecks(reg).ObserveProbe("ns/px", time.Millisecond, false)
	metrics.NewProviderRequests(reg).ProviderRequest("in-cluster", "create", "ok")
	metrics.NewOrphanDeletions(reg).OrphanDeleted("in-cluster", "pod")
	metrics.NewPoolRecycles(reg).Recycled("crawl", "eu")
	reg.MustRegister(metrics.NewPoolCollector(onePool{}), metrics.NewSiteCooldownCollector(onePool{}, 0),
		metrics.NewProviderHealthCollector(oneProvider{}), metrics.NewProxyCollector(onePhase{}, 0), metrics.NewProxyPriceCollector(onePrice{}, 0))
	return reg
}

// metricsReference is the generated table: every proxyfleet family with
// its type, labels, the command that serves it and its help text.
func metricsReference(t *testing.T) string {
	t.Helper()
	type row struct {
		typ, labels, help string
		by                []string
	}
	rows := map[string]*row{}
	for _, r := range []struct {
		by  string
		reg *prometheus.Registry
	}{{"gateway", gatewayMetrics()}, {"`--lease-api` or Redis `--lease-store` gateway", poolAPIGatewayMetrics()}, {"controller", controllerMetrics()}} {
		fams, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			var labels []string
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, "`"+l.GetName()+"`")
			}
			if x := rows[f.GetName()]; x != nil {
				x.by = append(x.by, r.by)
				continue
			}
			rows[f.GetName()] = &row{typ: strings.ToLower(f.GetType().String()), labels: strings.Join(labels, ", "),
				help: strings.ReplaceAll(f.GetHelp(), "|", `\|`), by: []string{r.by}}
		}
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("| metric | type | labels | served by | meaning |\n|---|---|---|---|---|\n")
	for _, n := range names {
		r := rows[n]
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", n, r.typ, r.labels, strings.Join(r.by, ", "), r.help)
	}
	return b.String()
}

// TestOperationsMetricsReferenceMatchesTheRegistries keeps the metrics
// reference in docs/operations.md generated from the registries, so it
// cannot go stale: a new, renamed or re-labelled metric fails here until
// the table is regenerated (-update-docs).
func TestOperationsMetricsReferenceMatchesTheRegistries(t *testing.T) {
	raw, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, referenceStart), strings.Index(doc, referenceEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/operations.md lacks the markers of the generated metrics reference:\n%s\n%s", referenceStart, referenceEnd)
	}
	want := metricsReference(t)
	got := doc[i+len(referenceStart)+1 : j]
	if got == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(operationsDoc, []byte(doc[:i+len(referenceStart)+1]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("the metrics reference in docs/operations.md is stale; run go test ./cmd/proxyfleet -run TestOperationsMetricsReference -update-docs. Want:\n%s", want)
}

// TestOperationsNamesEveryRenamedFlag: docs/operations.md's table of
// renamed flags has a row for each former name the commands accept.
func TestOperationsNamesEveryRenamedFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for newName, old := range formerNames {
		found := false
		for _, line := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(line, "| `--"+newName+"`") && strings.Contains(line, "`--"+old+"`") {
				found = true
			}
		}
		if !found {
			t.Errorf("docs/operations.md has no row for --%s, formerly --%s", newName, old)
		}
	}
}
