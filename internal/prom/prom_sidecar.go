//go:build sidecar

package prom

import (
	promlite "github.com/proxyfleet/proxyfleet/internal/promlite"
)

// The types of promlite, under client_golang's names.
type (
	Labels        = promlite.Labels
	ValueType     = promlite.ValueType
	Desc          = promlite.Desc
	Metric        = promlite.Metric
	Collector     = promlite.Collector
	CounterOpts   = promlite.CounterOpts
	GaugeOpts     = promlite.GaugeOpts
	HistogramOpts = promlite.HistogramOpts
	Counter       = promlite.Counter
	CounterVec    = promlite.CounterVec
	GaugeVec      = promlite.GaugeVec
	HistogramVec  = promlite.HistogramVec
	GaugeFunc     = promlite.GaugeFunc
	Registerer    = promlite.Registerer
	Gatherer      = promlite.Gatherer
	Registry      = promlite.Registry
	HandlerOpts   = promlite.HandlerOpts

	ProcessCollectorOpts = promlite.ProcessCollectorOpts
)

// The value types.
const (
	CounterValue = promlite.CounterValue
	GaugeValue   = promlite.GaugeValue
)

// The constructors and helpers of promlite.
var (
	NewDesc             = promlite.NewDesc
	BuildFQName         = promlite.BuildFQName
	MustNewConstMetric  = promlite.MustNewConstMetric
	NewCounter          = promlite.NewCounter
	NewCounterVec       = promlite.NewCounterVec
	NewGaugeVec         = promlite.NewGaugeVec
	NewHistogramVec     = promlite.NewHistogramVec
	NewGaugeFunc        = promlite.NewGaugeFunc
	NewRegistry         = promlite.NewRegistry
	HandlerFor          = promlite.HandlerFor
	NewGoCollector      = promlite.NewGoCollector
	NewProcessCollector = promlite.NewProcessCollector
)
