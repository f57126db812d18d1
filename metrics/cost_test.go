package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type stubPrices struct {
	prices []ProxyPrice
	err    error
}

func (s stubPrices) ProxyHourlyPrices(context.Context) ([]ProxyPrice, error) { return s.prices, s.err }

func TestProxyPriceCollectorReportsEachProxysPrice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewProxyPriceCollector(stubPrices{prices: []ProxyPrice{
		{Namespace: "crawl", Name: "eu-1", Provider: "aws-eu", Price: 0.0104},
		{Namespace: "crawl", Name: "eu-2", Provider: "aws-eu", Price: 0.0104},
	}}, 0))
	want := `
# HELP proxyfleet_proxy_hourly_price Configured hourly price of each Managed Proxy's instance (its provider entry's hourlyPrice), for cost accounting.
# TYPE proxyfleet_proxy_hourly_price gauge
proxyfleet_proxy_hourly_price{namespace="crawl",provider="aws-eu",proxy="eu-1"} 0.0104
proxyfleet_proxy_hourly_price{namespace="crawl",provider="aws-eu",proxy="eu-2"} 0.0104
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "proxyfleet_proxy_hourly_price"); err != nil {
		t.Fatal(err)
	}
	broken := prometheus.NewPedanticRegistry()
	broken.MustRegister(NewProxyPriceCollector(stubPrices{err: errors.New("the cache is not started")}, 0))
	if n, err := testutil.GatherAndCount(broken, "proxyfleet_proxy_hourly_price"); n != 0 || err != nil {
		t.Fatalf("unreadable source: %d series, %v; want none and no error", n, err)
	}
}
