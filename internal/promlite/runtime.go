package promlite

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// NewGoCollector yields the Go runtime's figures an operator looks at
// first, under client_golang's names: go_goroutines, go_threads, go_info,
// go_sched_gomaxprocs_threads, go_gc_gomemlimit_bytes and the
// go_memstats_* of the heap and of the memory taken from the system.
// client_golang's collector has more (go_gc_duration_seconds and the
// allocator's internals); the sidecar leaves those out.
func NewGoCollector() Collector { return goCollector{} }

type goCollector struct{}

var (
	goDescs = struct {
		goroutines, threads, info, maxprocs, memlimit, alloc, allocTotal, heapInuse, heapObjects, heapIdle, heapReleased, sys, nextGC, lastGC, gcs *Desc
	}{
		goroutines:   NewDesc("go_goroutines", "Number of goroutines that currently exist.", nil, nil),
		threads:      NewDesc("go_threads", "Number of OS threads created.", nil, nil),
		info:         NewDesc("go_info", "Information about the Go environment.", []string{"version"}, nil),
		maxprocs:     NewDesc("go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously.", nil, nil),
		memlimit:     NewDesc("go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64.", nil, nil),
		alloc:        NewDesc("go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use.", nil, nil),
		allocTotal:   NewDesc("go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already.", nil, nil),
		heapInuse:    NewDesc("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", nil, nil),
		heapObjects:  NewDesc("go_memstats_heap_objects", "Number of currently allocated objects.", nil, nil),
		heapIdle:     NewDesc("go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used.", nil, nil),
		heapReleased: NewDesc("go_memstats_heap_released_bytes", "Number of heap bytes released to OS.", nil, nil),
		sys:          NewDesc("go_memstats_sys_bytes", "Number of bytes obtained from system.", nil, nil),
		nextGC:       NewDesc("go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place.", nil, nil),
		lastGC:       NewDesc("go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", nil, nil),
		gcs:          NewDesc("go_gc_cycles_total", "Completed GC cycles.", nil, nil),
	}
)

func (goCollector) Describe(ch chan<- *Desc) {
	for _, d := range []*Desc{goDescs.goroutines, goDescs.threads, goDescs.info, goDescs.maxprocs, goDescs.memlimit, goDescs.alloc, goDescs.allocTotal,
		goDescs.heapInuse, goDescs.heapObjects, goDescs.heapIdle, goDescs.heapReleased, goDescs.sys, goDescs.nextGC, goDescs.lastGC, goDescs.gcs} {
		ch <- d
	}
}

func (goCollector) Collect(ch chan<- Metric) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	threads, _ := runtime.ThreadCreateProfile(nil)
	g := func(d *Desc, v float64) { ch <- MustNewConstMetric(d, GaugeValue, v) }
	g(goDescs.goroutines, float64(runtime.NumGoroutine()))
	g(goDescs.threads, float64(threads))
	ch <- MustNewConstMetric(goDescs.info, GaugeValue, 1, runtime.Version())
	g(goDescs.maxprocs, float64(runtime.GOMAXPROCS(0)))
	g(goDescs.memlimit, float64(debug.SetMemoryLimit(-1)))
	g(goDescs.alloc, float64(ms.Alloc))
	ch <- MustNewConstMetric(goDescs.allocTotal, CounterValue, float64(ms.TotalAlloc))
	g(goDescs.heapInuse, float64(ms.HeapInuse))
	g(goDescs.heapObjects, float64(ms.HeapObjects))
	g(goDescs.heapIdle, float64(ms.HeapIdle))
	g(goDescs.heapReleased, float64(ms.HeapReleased))
	g(goDescs.sys, float64(ms.Sys))
	g(goDescs.nextGC, float64(ms.NextGC))
	g(goDescs.lastGC, float64(ms.LastGC)/1e9)
	ch <- MustNewConstMetric(goDescs.gcs, CounterValue, float64(ms.NumGC))
}

// ProcessCollectorOpts configure NewProcessCollector; none are read.
type ProcessCollectorOpts struct{}

// NewProcessCollector yields the process' CPU time, memory, file
// descriptors and start time from /proc/self, under client_golang's
// process_* names (nothing off Linux).
func NewProcessCollector(ProcessCollectorOpts) Collector { return processCollector{} }

type processCollector struct{}

var procDescs = struct{ cpu, rss, vsize, fds, maxFDs, start *Desc }{
	cpu:    NewDesc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", nil, nil),
	rss:    NewDesc("process_resident_memory_bytes", "Resident memory size in bytes.", nil, nil),
	vsize:  NewDesc("process_virtual_memory_bytes", "Virtual memory size in bytes.", nil, nil),
	fds:    NewDesc("process_open_fds", "Number of open file descriptors.", nil, nil),
	maxFDs: NewDesc("process_max_fds", "Maximum number of open file descriptors.", nil, nil),
	start:  NewDesc("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", nil, nil),
}

func (processCollector) Describe(ch chan<- *Desc) {
	for _, d := range []*Desc{procDescs.cpu, procDescs.rss, procDescs.vsize, procDescs.fds, procDescs.maxFDs, procDescs.start} {
		ch <- d
	}
}

// clockTicks is USER_HZ, 100 on every Linux the sidecar runs on.
const clockTicks = 100

func (processCollector) Collect(ch chan<- Metric) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return
	}
	// Fields after the command, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
	// f[0] is field 3 (state): utime is field 14, stime 15, starttime 22,
	// vsize 23, rss 24 (pages).
	ch <- MustNewConstMetric(procDescs.cpu, CounterValue, (num(11)+num(12))/clockTicks)
	ch <- MustNewConstMetric(procDescs.vsize, GaugeValue, num(20))
	ch <- MustNewConstMetric(procDescs.rss, GaugeValue, num(21)*float64(os.Getpagesize()))
	if boot := bootTime(); boot > 0 {
		ch <- MustNewConstMetric(procDescs.start, GaugeValue, boot+num(19)/clockTicks)
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		ch <- MustNewConstMetric(procDescs.fds, GaugeValue, float64(len(ents)))
	}
	if lim := maxFDs(); lim > 0 {
		ch <- MustNewConstMetric(procDescs.maxFDs, GaugeValue, lim)
	}
}

// bootTime is the system's boot time in Unix seconds (/proc/stat btime).
func bootTime() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n
		}
	}
	return 0
}

// maxFDs is the soft limit on open files (/proc/self/limits).
func maxFDs() float64 {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(line)
			if len(f) >= 4 {
				n, _ := strconv.ParseFloat(f[3], 64)
				return n
			}
		}
	}
	return 0
}
