// Package promlite is the small Prometheus client the sidecar build links
// instead of client_golang: counters, gauges, histograms and collectors of
// constant metrics, a registry, and the text exposition format (0.0.4)
// served on /metrics. It implements exactly the part of client_golang's
// API that proxyfleet's metrics package uses, with the same names, so
// internal/prom can alias either one; its output for the same metrics is
// byte for byte client_golang's (a test compares them).
//
// Why: client_golang links its protobuf data model, and a sidecar runs
// beside every crawler pod; the sidecar's binary and idle memory follow
// the code it links (docs/performance.md). It imports nothing of ours.
package promlite

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Labels are label names and values.
type Labels map[string]string

// ValueType is the type of a constant metric's value.
type ValueType int

// The value types MustNewConstMetric takes.
const (
	_ ValueType = iota
	CounterValue
	GaugeValue
	UntypedValue
)

func (v ValueType) typeName() string {
	switch v {
	case CounterValue:
		return "counter"
	case GaugeValue:
		return "gauge"
	}
	return "untyped"
}

// Desc describes a metric: its full name, help, constant labels and the
// names of its variable labels.
type Desc struct {
	fqName      string
	help        string
	constLabels []labelPair // sorted by name
	varLabels   []string
}

type labelPair struct{ name, value string }

// NewDesc makes a Desc.
func NewDesc(fqName, help string, variableLabels []string, constLabels Labels) *Desc {
	d := &Desc{fqName: fqName, help: help, varLabels: variableLabels}
	for k, v := range constLabels {
		d.constLabels = append(d.constLabels, labelPair{k, v})
	}
	sort.Slice(d.constLabels, func(i, j int) bool { return d.constLabels[i].name < d.constLabels[j].name })
	return d
}

// BuildFQName joins the non-empty parts of a metric name with "_".
func BuildFQName(namespace, subsystem, name string) string {
	if name == "" {
		return ""
	}
	var parts []string
	for _, p := range []string{namespace, subsystem, name} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "_")
}

// Metric is one sample (or, for a histogram, one series) ready to be
// written; only this package makes them.
type Metric interface {
	Desc() *Desc
	sample() sample
}

// sample is a Metric's content: its label values (as its Desc names
// them), and a value or a histogram.
type sample struct {
	labels []string
	value  float64
	hist   *histSnapshot
	kind   string // "counter", "gauge", "untyped", "histogram"
}

type histSnapshot struct {
	upper  []float64
	counts []uint64 // cumulative
	sum    float64
	count  uint64
}

// Collector is anything that describes and yields metrics.
type Collector interface {
	Describe(chan<- *Desc)
	Collect(chan<- Metric)
}

type constMetric struct {
	d *Desc
	s sample
}

func (m constMetric) Desc() *Desc    { return m.d }
func (m constMetric) sample() sample { return m.s }

// MustNewConstMetric is a metric with a fixed value; it panics when the
// label values do not match the Desc.
func MustNewConstMetric(desc *Desc, vt ValueType, value float64, labelValues ...string) Metric {
	if len(labelValues) != len(desc.varLabels) {
		panic(fmt.Sprintf("promlite: %s wants %d label values, got %d", desc.fqName, len(desc.varLabels), len(labelValues)))
	}
	return constMetric{d: desc, s: sample{labels: labelValues, value: value, kind: vt.typeName()}}
}

// Opts name and describe a metric.
type Opts struct {
	Namespace, Subsystem, Name, Help string
	ConstLabels                      Labels
}

// CounterOpts are a counter's Opts.
type CounterOpts Opts

// GaugeOpts are a gauge's Opts.
type GaugeOpts Opts

// HistogramOpts are a histogram's Opts and its buckets' upper bounds.
type HistogramOpts struct {
	Namespace, Subsystem, Name, Help string
	ConstLabels                      Labels
	Buckets                          []float64
}

// DefBuckets are client_golang's default buckets.
var DefBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// atomicFloat is a float64 updated without locks.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) add(v float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}
func (f *atomicFloat) set(v float64) { f.bits.Store(math.Float64bits(v)) }
func (f *atomicFloat) load() float64 { return math.Float64frombits(f.bits.Load()) }

// Counter is a value that only goes up.
type Counter interface {
	Metric
	Collector
	Inc()
	Add(float64)
}

// Gauge is a value that goes up and down.
type Gauge interface {
	Metric
	Collector
	Set(float64)
	Inc()
	Dec()
	Add(float64)
	Sub(float64)
	SetToCurrentTime()
}

// Observer takes observations (a histogram's).
type Observer interface {
	Observe(float64)
}

// value is one counter or gauge series.
type value struct {
	d      *Desc
	labels []string
	kind   string
	v      atomicFloat
}

func (v *value) Desc() *Desc { return v.d }
func (v *value) sample() sample {
	return sample{labels: v.labels, value: v.v.load(), kind: v.kind}
}
func (v *value) Describe(ch chan<- *Desc) { ch <- v.d }
func (v *value) Collect(ch chan<- Metric) { ch <- v }
func (v *value) Inc()                     { v.v.add(1) }
func (v *value) Dec()                     { v.v.add(-1) }
func (v *value) Sub(x float64)            { v.v.add(-x) }
func (v *value) Set(x float64)            { v.v.set(x) }

// SetToCurrentTime sets the gauge to the Unix time in seconds.
func (v *value) SetToCurrentTime() { v.v.set(float64(time.Now().UnixNano()) / 1e9) }

// Add adds x; a counter panics on a negative x, as client_golang's does.
func (v *value) Add(x float64) {
	if v.kind == "counter" && x < 0 {
		panic("promlite: counter cannot decrease")
	}
	v.v.add(x)
}

func descOf(o Opts, labels []string) *Desc {
	return NewDesc(BuildFQName(o.Namespace, o.Subsystem, o.Name), o.Help, labels, o.ConstLabels)
}

// NewCounter makes a counter without variable labels.
func NewCounter(o CounterOpts) Counter {
	return &value{d: descOf(Opts(o), nil), kind: "counter"}
}

// GaugeFunc is a gauge whose value a function reads at each scrape.
type GaugeFunc interface {
	Metric
	Collector
}

type gaugeFunc struct {
	d  *Desc
	fn func() float64
}

func (g *gaugeFunc) Desc() *Desc              { return g.d }
func (g *gaugeFunc) sample() sample           { return sample{value: g.fn(), kind: "gauge"} }
func (g *gaugeFunc) Describe(ch chan<- *Desc) { ch <- g.d }
func (g *gaugeFunc) Collect(ch chan<- Metric) { ch <- g }

// NewGaugeFunc makes a gauge read from fn at every scrape.
func NewGaugeFunc(o GaugeOpts, fn func() float64) GaugeFunc {
	return &gaugeFunc{d: descOf(Opts(o), nil), fn: fn}
}

// vec is the series of one metric by label values.
type vec[T any] struct {
	d    *Desc
	make func(labels []string) T
	mu   sync.RWMutex
	m    map[string]vecEntry[T]
}

type vecEntry[T any] struct {
	labels []string
	v      T
}

func newVec[T any](d *Desc, mk func([]string) T) *vec[T] {
	return &vec[T]{d: d, make: mk, m: map[string]vecEntry[T]{}}
}

func (v *vec[T]) with(values []string) T {
	if len(values) != len(v.d.varLabels) {
		panic(fmt.Sprintf("promlite: %s wants %d label values, got %d", v.d.fqName, len(v.d.varLabels), len(values)))
	}
	key := strings.Join(values, "\xff")
	v.mu.RLock()
	e, ok := v.m[key]
	v.mu.RUnlock()
	if ok {
		return e.v
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.m[key]; ok {
		return e.v
	}
	labels := append([]string(nil), values...)
	e = vecEntry[T]{labels: labels, v: v.make(labels)}
	v.m[key] = e
	return e.v
}

func (v *vec[T]) withLabels(l Labels) T {
	values := make([]string, len(v.d.varLabels))
	for i, n := range v.d.varLabels {
		values[i] = l[n]
	}
	return v.with(values)
}

// deleteMatching drops the series whose labels hold every pair of l;
// exact also wants l to name every label. It returns how many it dropped.
func (v *vec[T]) deleteMatching(l Labels, exact bool) int {
	if exact && len(l) != len(v.d.varLabels) {
		return 0
	}
	idx := map[string]int{}
	for i, n := range v.d.varLabels {
		idx[n] = i
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
outer:
	for k, e := range v.m {
		for name, val := range l {
			i, ok := idx[name]
			if !ok || e.labels[i] != val {
				continue outer
			}
		}
		delete(v.m, k)
		n++
	}
	return n
}

func (v *vec[T]) Describe(ch chan<- *Desc) { ch <- v.d }

func (v *vec[T]) each(fn func(T)) {
	v.mu.RLock()
	all := make([]T, 0, len(v.m))
	for _, e := range v.m {
		all = append(all, e.v)
	}
	v.mu.RUnlock()
	for _, x := range all {
		fn(x)
	}
}

// CounterVec is a counter per label values.
type CounterVec struct{ *vec[*value] }

// NewCounterVec makes a counter per values of labels.
func NewCounterVec(o CounterOpts, labels []string) *CounterVec {
	d := descOf(Opts(o), labels)
	return &CounterVec{newVec(d, func(l []string) *value { return &value{d: d, labels: l, kind: "counter"} })}
}

// WithLabelValues is the counter of those label values.
func (c *CounterVec) WithLabelValues(values ...string) Counter { return c.with(values) }

// With is the counter of those labels.
func (c *CounterVec) With(l Labels) Counter { return c.withLabels(l) }

// Delete drops the series with exactly those labels.
func (c *CounterVec) Delete(l Labels) bool { return c.deleteMatching(l, true) > 0 }

// DeletePartialMatch drops every series whose labels hold those.
func (c *CounterVec) DeletePartialMatch(l Labels) int { return c.deleteMatching(l, false) }

// Collect yields every series.
func (c *CounterVec) Collect(ch chan<- Metric) { c.each(func(v *value) { ch <- v }) }

// GaugeVec is a gauge per label values.
type GaugeVec struct{ *vec[*value] }

// NewGaugeVec makes a gauge per values of labels.
func NewGaugeVec(o GaugeOpts, labels []string) *GaugeVec {
	d := descOf(Opts(o), labels)
	return &GaugeVec{newVec(d, func(l []string) *value { return &value{d: d, labels: l, kind: "gauge"} })}
}

// WithLabelValues is the gauge of those label values.
func (g *GaugeVec) WithLabelValues(values ...string) Gauge { return g.with(values) }

// With is the gauge of those labels.
func (g *GaugeVec) With(l Labels) Gauge { return g.withLabels(l) }

// Delete drops the series with exactly those labels.
func (g *GaugeVec) Delete(l Labels) bool { return g.deleteMatching(l, true) > 0 }

// DeletePartialMatch drops every series whose labels hold those.
func (g *GaugeVec) DeletePartialMatch(l Labels) int { return g.deleteMatching(l, false) }

// Collect yields every series.
func (g *GaugeVec) Collect(ch chan<- Metric) { g.each(func(v *value) { ch <- v }) }

// histogram is one histogram series.
type histogram struct {
	d      *Desc
	labels []string
	upper  []float64
	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	count  uint64
}

func (h *histogram) Desc() *Desc { return h.d }

// Observe counts v in its bucket.
func (h *histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.upper, v)
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.count++
	h.mu.Unlock()
}

func (h *histogram) sample() sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &histSnapshot{upper: h.upper, counts: make([]uint64, len(h.upper)), sum: h.sum, count: h.count}
	var c uint64
	for i := range h.upper {
		c += h.counts[i]
		s.counts[i] = c
	}
	return sample{labels: h.labels, hist: s, kind: "histogram"}
}

// HistogramVec is a histogram per label values.
type HistogramVec struct{ *vec[*histogram] }

// NewHistogramVec makes a histogram per values of labels.
func NewHistogramVec(o HistogramOpts, labels []string) *HistogramVec {
	d := descOf(Opts{Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help, ConstLabels: o.ConstLabels}, labels)
	upper := o.Buckets
	if len(upper) == 0 {
		upper = DefBuckets
	}
	upper = append([]float64(nil), upper...)
	sort.Float64s(upper)
	return &HistogramVec{newVec(d, func(l []string) *histogram {
		return &histogram{d: d, labels: l, upper: upper, counts: make([]uint64, len(upper)+1)}
	})}
}

// WithLabelValues is the histogram of those label values.
func (h *HistogramVec) WithLabelValues(values ...string) Observer { return h.with(values) }

// With is the histogram of those labels.
func (h *HistogramVec) With(l Labels) Observer { return h.withLabels(l) }

// Delete drops the series with exactly those labels.
func (h *HistogramVec) Delete(l Labels) bool { return h.deleteMatching(l, true) > 0 }

// DeletePartialMatch drops every series whose labels hold those.
func (h *HistogramVec) DeletePartialMatch(l Labels) int { return h.deleteMatching(l, false) }

// Collect yields every series.
func (h *HistogramVec) Collect(ch chan<- Metric) { h.each(func(x *histogram) { ch <- x }) }

// Registerer takes collectors.
type Registerer interface {
	Register(Collector) error
	MustRegister(...Collector)
}

// Gatherer is what a /metrics handler writes out.
type Gatherer interface {
	gather() []family
}

// Registry holds collectors; it is a Registerer and a Gatherer.
type Registry struct {
	mu         sync.Mutex
	collectors []Collector
	names      map[string]bool
}

// NewRegistry makes an empty registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

// Register adds c; a metric name registered twice is an error.
func (r *Registry) Register(c Collector) error {
	ch := make(chan *Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	var names []string
	for d := range ch {
		names = append(names, d.fqName)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if r.names[n] {
			return errors.New("promlite: " + n + " is registered twice")
		}
	}
	for _, n := range names {
		r.names[n] = true
	}
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister registers each of cs, panicking on an error.
func (r *Registry) MustRegister(cs ...Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// family is every sample of one metric name.
type family struct {
	name, help, kind string
	samples          []sampleOf
}

type sampleOf struct {
	d *Desc
	s sample
}

func (r *Registry) gather() []family {
	r.mu.Lock()
	cs := append([]Collector(nil), r.collectors...)
	r.mu.Unlock()
	byName := map[string]*family{}
	for _, c := range cs {
		ch := make(chan Metric, 64)
		go func() { c.Collect(ch); close(ch) }()
		for m := range ch {
			d, s := m.Desc(), m.sample()
			f := byName[d.fqName]
			if f == nil {
				f = &family{name: d.fqName, help: d.help, kind: s.kind}
				byName[d.fqName] = f
			}
			f.samples = append(f.samples, sampleOf{d, s})
		}
	}
	out := make([]family, 0, len(byName))
	for _, f := range byName {
		sort.SliceStable(f.samples, func(i, j int) bool { return lessLabels(f.samples[i], f.samples[j]) })
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// pairs are a sample's labels, constant and variable, sorted by name as
// the exposition writes them.
func (s sampleOf) pairs() []labelPair {
	ps := append([]labelPair(nil), s.d.constLabels...)
	for i, n := range s.d.varLabels {
		ps = append(ps, labelPair{n, s.s.labels[i]})
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].name < ps[j].name })
	return ps
}

func lessLabels(a, b sampleOf) bool {
	pa, pb := a.pairs(), b.pairs()
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i].value != pb[i].value {
			return pa[i].value < pb[i].value
		}
	}
	return len(pa) < len(pb)
}
