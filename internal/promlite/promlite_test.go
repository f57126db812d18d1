package promlite

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// scrape is what a handler serves for GET /metrics.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	b, err := io.ReadAll(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTheSameMetricsReadTheSameAsClientGolangs makes one set of metrics
// in client_golang and in promlite, does the same to both, and compares
// the two /metrics bodies byte for byte: every kind the metrics package
// uses, label values that need escaping, deleted series, const labels.
func TestTheSameMetricsReadTheSameAsClientGolangs(t *testing.T) {
	// client_golang
	creg := prometheus.NewRegistry()
	cReq := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pf", Subsystem: "gw", Name: "requests_total", Help: "Requests, by member\nand outcome \\ all."}, []string{"member", "outcome"})
	cDur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "pf", Name: "duration_seconds", Help: "Durations.", Buckets: []float64{.005, .1, 1, 2.5, 300}}, []string{"outcome"})
	cGauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pf", Name: "last_seconds", Help: "Last.", ConstLabels: prometheus.Labels{"z": "1", "a": "2"}}, []string{"proxy"})
	cOne := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pf", Name: "outages_total", Help: "Outages."})
	cFunc := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "pf", Name: "state", Help: "State."}, func() float64 { return 2 })
	cEmpty := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pf", Name: "never_total", Help: "Never counted."}, []string{"x"})
	cDesc := prometheus.NewDesc(prometheus.BuildFQName("pf", "site", "waited_total"), "Waited.", []string{"site"}, nil)
	creg.MustRegister(cReq, cDur, cGauge, cOne, cFunc, cEmpty, clientConst{cDesc})

	// promlite
	lreg := NewRegistry()
	lReq := NewCounterVec(CounterOpts{Namespace: "pf", Subsystem: "gw", Name: "requests_total", Help: "Requests, by member\nand outcome \\ all."}, []string{"member", "outcome"})
	lDur := NewHistogramVec(HistogramOpts{Namespace: "pf", Name: "duration_seconds", Help: "Durations.", Buckets: []float64{.005, .1, 1, 2.5, 300}}, []string{"outcome"})
	lGauge := NewGaugeVec(GaugeOpts{Namespace: "pf", Name: "last_seconds", Help: "Last.", ConstLabels: Labels{"z": "1", "a": "2"}}, []string{"proxy"})
	lOne := NewCounter(CounterOpts{Namespace: "pf", Name: "outages_total", Help: "Outages."})
	lFunc := NewGaugeFunc(GaugeOpts{Namespace: "pf", Name: "state", Help: "State."}, func() float64 { return 2 })
	lEmpty := NewCounterVec(CounterOpts{Namespace: "pf", Name: "never_total", Help: "Never counted."}, []string{"x"})
	lDesc := NewDesc(BuildFQName("pf", "site", "waited_total"), "Waited.", []string{"site"}, nil)
	lreg.MustRegister(lReq, lDur, lGauge, lOne, lFunc, lEmpty, liteConst{lDesc})

	for _, m := range []string{"127.0.0.1:3128", `a"b\c` + "\nd", "z", "b"} {
		for _, o := range []string{"ok", "banned"} {
			cReq.WithLabelValues(m, o).Add(3)
			lReq.WithLabelValues(m, o).Add(3)
		}
	}
	cReq.With(prometheus.Labels{"member": "z", "outcome": "ok"}).Inc()
	lReq.With(Labels{"member": "z", "outcome": "ok"}).Inc()
	cReq.DeletePartialMatch(prometheus.Labels{"member": "b"})
	lReq.DeletePartialMatch(Labels{"member": "b"})
	for _, v := range []float64{0, .005, .0051, .5, 3, 1e9, 2.5} {
		cDur.WithLabelValues("ok").Observe(v)
		lDur.WithLabelValues("ok").Observe(v)
	}
	cDur.WithLabelValues("timeout").Observe(60)
	lDur.WithLabelValues("timeout").Observe(60)
	cGauge.WithLabelValues("ns/p1").Set(1.5e9)
	lGauge.WithLabelValues("ns/p1").Set(1.5e9)
	cGauge.WithLabelValues("ns/p2").Set(math.Inf(1))
	lGauge.WithLabelValues("ns/p2").Set(math.Inf(1))
	cGauge.WithLabelValues("ns/p3").Set(7)
	lGauge.WithLabelValues("ns/p3").Set(7)
	cGauge.Delete(prometheus.Labels{"proxy": "ns/p3"})
	lGauge.Delete(Labels{"proxy": "ns/p3"})
	cOne.Inc()
	lOne.Inc()

	want := scrape(t, promhttp.HandlerFor(creg, promhttp.HandlerOpts{}))
	got := scrape(t, HandlerFor(lreg, HandlerOpts{}))
	if got != want {
		t.Fatalf("promlite's /metrics differs from client_golang's:\n--- promlite\n%s\n--- client_golang\n%s", got, want)
	}
	if !strings.Contains(got, `pf_gw_requests_total{member="a\"b\\c\nd",outcome="ok"} 3`) {
		t.Fatalf("the escaped series is not there:\n%s", got)
	}
}

type clientConst struct{ d *prometheus.Desc }

func (c clientConst) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c clientConst) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.d, prometheus.CounterValue, 4, "b.example")
	ch <- prometheus.MustNewConstMetric(c.d, prometheus.CounterValue, 0.25, "a.example")
}

type liteConst struct{ d *Desc }

func (c liteConst) Describe(ch chan<- *Desc) { ch <- c.d }
func (c liteConst) Collect(ch chan<- Metric) {
	ch <- MustNewConstMetric(c.d, CounterValue, 4, "b.example")
	ch <- MustNewConstMetric(c.d, CounterValue, 0.25, "a.example")
}

func TestARegistryRefusesANameTwice(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(NewCounter(CounterOpts{Name: "x_total"}))
	if err := reg.Register(NewCounter(CounterOpts{Name: "x_total"})); err == nil {
		t.Fatal("a second x_total was registered")
	}
}

func TestCountersAddUpUnderConcurrency(t *testing.T) {
	v := NewCounterVec(CounterOpts{Name: "c_total"}, []string{"k"})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				v.WithLabelValues("a").Add(0.5)
			}
		})
	}
	wg.Wait()
	if got := v.WithLabelValues("a").(*value).v.load(); got != 4000 {
		t.Fatalf("8 × 1000 × 0.5 = %v", got)
	}
}

func TestTheRuntimeCollectorsYieldTheFiguresOperatorsLookAt(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(NewGoCollector(), NewProcessCollector(ProcessCollectorOpts{}))
	body := scrape(t, HandlerFor(reg, HandlerOpts{}))
	for _, name := range []string{"go_goroutines ", "go_memstats_heap_inuse_bytes ", "go_sched_gomaxprocs_threads ", "go_info{version=",
		"process_resident_memory_bytes ", "process_cpu_seconds_total ", "process_open_fds ", "process_max_fds ", "process_start_time_seconds "} {
		if !strings.Contains(body, "\n"+name) && !strings.HasPrefix(body, name) {
			t.Errorf("no %s in:\n%s", strings.TrimSpace(name), body)
		}
	}
}
