//go:build !sidecar

// Package prom is the Prometheus client proxyfleet's metrics are written
// against: client_golang itself in the full build (the controller's
// metrics share controller-runtime's registry), internal/promlite in the
// sidecar build, whose binary and memory follow the code it links. Both
// offer the same names, so the metrics package is one source for both.
//
// It imports client_golang or internal/promlite (by build tag) and nothing
// else of proxyfleet.
package prom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The types of client_golang the metrics use.
type (
	Labels        = prometheus.Labels
	ValueType     = prometheus.ValueType
	Desc          = prometheus.Desc
	Metric        = prometheus.Metric
	Collector     = prometheus.Collector
	CounterOpts   = prometheus.CounterOpts
	GaugeOpts     = prometheus.GaugeOpts
	HistogramOpts = prometheus.HistogramOpts
	Counter       = prometheus.Counter
	CounterVec    = prometheus.CounterVec
	GaugeVec      = prometheus.GaugeVec
	HistogramVec  = prometheus.HistogramVec
	GaugeFunc     = prometheus.GaugeFunc
	Registerer    = prometheus.Registerer
	Gatherer      = prometheus.Gatherer
	Registry      = prometheus.Registry
	HandlerOpts   = promhttp.HandlerOpts

	ProcessCollectorOpts = collectors.ProcessCollectorOpts
)

// The value types.
const (
	CounterValue = prometheus.CounterValue
	GaugeValue   = prometheus.GaugeValue
)

// The constructors and helpers of client_golang the metrics use.
var (
	NewDesc             = prometheus.NewDesc
	BuildFQName         = prometheus.BuildFQName
	MustNewConstMetric  = prometheus.MustNewConstMetric
	NewCounter          = prometheus.NewCounter
	NewCounterVec       = prometheus.NewCounterVec
	NewGaugeVec         = prometheus.NewGaugeVec
	NewHistogramVec     = prometheus.NewHistogramVec
	NewGaugeFunc        = prometheus.NewGaugeFunc
	NewRegistry         = prometheus.NewRegistry
	HandlerFor          = promhttp.HandlerFor
	NewGoCollector      = func() Collector { return collectors.NewGoCollector() }
	NewProcessCollector = collectors.NewProcessCollector
)
